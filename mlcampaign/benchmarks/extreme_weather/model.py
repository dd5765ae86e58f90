"""Extreme Weather Analytics (HPC AI500): Faster R-CNN detecting extreme weather events in CAM5 fields.

torchvision's Faster R-CNN with a ResNet + feature pyramid backbone, as
``torchvision.models.detection.fasterrcnn_resnet50_fpn`` builds it without pretrained weights
(all layers trainable, BatchNorm2d), adapted to climate data:

- the first convolution takes ``in_channels`` (16 CAM5 variables) instead of RGB;
- normalisation: the reader standardises every channel with the dataset's mean and std
  (``stats.h5`` of the ``extreme_weather_hdf5`` format, like DeepCAM's min-max statistics), so
  the detector's ``GeneralizedRCNNTransform`` gets mean 0 / std 1 per channel (its defaults are
  ImageNet's three RGB values);
- no resizing: the transform's ``min_size``/``max_size`` are the image's own sides, so a
  768 x 1152 field is seen at 768 x 1152 (sides must be multiples of 32, the transform's
  padding unit, so that it pads nothing either).

Options: ``in_channels`` (16), ``num_classes`` (5: background + the ExtremeWeather classes
tropical depression, tropical cyclone, extratropical cyclone, atmospheric river),
``image_height`` x ``image_width`` (768 x 1152), ``backbone`` (a torchvision ResNet:
resnet50 at spec; resnet18/34 for cheaper runs), ``stage_blocks`` (residual blocks in each of
the four stages; default the named ResNet's, fewer for a shallower network of the same widths on
CPU runs), ``fpn_channels`` (256), ``representation_size``
(1024, the box head's two fully connected layers), ``anchor_sizes`` (one per pyramid level,
32..512) and ``aspect_ratios`` (0.5, 1, 2), and torchvision's proposal and sampling counts
``rpn_pre_nms_top_n_train/test`` (2000/1000), ``rpn_post_nms_top_n_train/test`` (2000/1000),
``box_batch_size_per_image`` (512) and ``box_detections_per_img`` (100). The defaults are
torchvision's, so the full-size model is ``fasterrcnn_resnet50_fpn`` with a 16-channel stem.

Training: the model returns torchvision's loss dict (RPN objectness and box regression, box
classifier and box regression); the loss is their sum, as in torchvision's detection reference.
Quality: mAP at IoU 0.5 (``map50``) from ``torchmetrics.detection.MeanAveragePrecision``
(COCO-style 101-point interpolated AP per class, averaged over classes).

FLOPs: the detector's dense part (backbone, pyramid and RPN head on every anchor) has a fixed
cost per image; its box head runs once per region of interest, a data-dependent number. The
count (``counted_work``) takes the configured maxima: ``box_batch_size_per_image`` sampled
regions per image in training (exactly that many when there are enough proposals, as there are
at these proposal counts) and ``rpn_post_nms_top_n_test`` proposals per image in evaluation (an
upper bound: non-maximum suppression may keep fewer). RoIAlign, anchor matching, NMS and the
losses are not convolutions or matrix products and are not counted, as everywhere in
``mlcampaign.measure.flops``.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet
from torchvision.ops import MultiScaleRoIAlign

from mlcampaign.trial.torch.models import ModelSpec

SIZE_DIVISIBLE = 32  # GeneralizedRCNNTransform pads both sides to a multiple of this
PYRAMID_LEVELS = ("0", "1", "2", "3")  # ResNet stages 1-4; the pool level adds a fifth for the RPN
ROI_OUTPUT_SIZE = 7  # RoIAlign output (torchvision's default box head input)
# torchvision's ResNets: residual block and blocks per stage (torchvision.models.resnet).
RESNETS = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}
DEFAULT_ANCHOR_SIZES = (32, 64, 128, 256, 512)


def _resnet_fpn(backbone: str, stage_blocks: list[int] | None, in_channels: int, fpn_channels: int) -> BackboneWithFPN:
    """A torchvision ResNet (BatchNorm, all layers trainable) reading ``in_channels``, under a feature pyramid."""
    if backbone not in RESNETS:
        raise ValueError(f"model option backbone='{backbone}' must be one of {list(RESNETS)}")
    block, depths = RESNETS[backbone]
    if stage_blocks is not None and (len(stage_blocks) != len(depths) or min(stage_blocks) < 1):
        raise ValueError(f"model option stage_blocks={stage_blocks} must be {len(depths)} block counts >= 1")
    # As torchvision.models.resnet50(weights=None, norm_layer=...) builds it, at the chosen depths.
    body = ResNet(block, list(stage_blocks or depths), norm_layer=nn.BatchNorm2d)
    stem = body.conv1
    body.conv1 = nn.Conv2d(in_channels, stem.out_channels, stem.kernel_size, stem.stride, stem.padding, bias=False)
    nn.init.kaiming_normal_(body.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's ResNet
    last_stage = body.inplanes  # channels out of layer4 (2048 for the bottleneck ResNets, 512 otherwise)
    return BackboneWithFPN(
        body,
        return_layers={f"layer{index + 1}": name for index, name in enumerate(PYRAMID_LEVELS)},
        in_channels_list=[last_stage // 8, last_stage // 4, last_stage // 2, last_stage],
        out_channels=fpn_channels,
    )


def build(
    in_channels: int = 16,
    num_classes: int = 5,
    image_height: int = 768,
    image_width: int = 1152,
    backbone: str = "resnet50",
    stage_blocks: list[int] | None = None,
    fpn_channels: int = 256,
    representation_size: int = 1024,
    anchor_sizes: tuple[int, ...] | list[int] = DEFAULT_ANCHOR_SIZES,
    aspect_ratios: tuple[float, ...] | list[float] = (0.5, 1.0, 2.0),
    rpn_pre_nms_top_n_train: int = 2000,
    rpn_pre_nms_top_n_test: int = 1000,
    rpn_post_nms_top_n_train: int = 2000,
    rpn_post_nms_top_n_test: int = 1000,
    box_batch_size_per_image: int = 512,
    box_detections_per_img: int = 100,
) -> FasterRCNN:
    for name, size in (("image_height", image_height), ("image_width", image_width)):
        if size % SIZE_DIVISIBLE:
            raise ValueError(f"model option {name}={size} must be a multiple of {SIZE_DIVISIBLE} (no padding)")
    if len(anchor_sizes) != len(PYRAMID_LEVELS) + 1:
        raise ValueError(
            f"model option anchor_sizes={list(anchor_sizes)} needs one size per pyramid level "
            f"({len(PYRAMID_LEVELS) + 1})"
        )
    features = _resnet_fpn(backbone, stage_blocks, in_channels, fpn_channels)
    anchors = AnchorGenerator(
        sizes=tuple((size,) for size in anchor_sizes), aspect_ratios=(tuple(aspect_ratios),) * len(anchor_sizes)
    )
    return FasterRCNN(
        features,
        min_size=min(image_height, image_width),
        max_size=max(image_height, image_width),
        image_mean=[0.0] * in_channels,
        image_std=[1.0] * in_channels,
        rpn_anchor_generator=anchors,
        rpn_pre_nms_top_n_train=rpn_pre_nms_top_n_train,
        rpn_pre_nms_top_n_test=rpn_pre_nms_top_n_test,
        rpn_post_nms_top_n_train=rpn_post_nms_top_n_train,
        rpn_post_nms_top_n_test=rpn_post_nms_top_n_test,
        box_roi_pool=MultiScaleRoIAlign(list(PYRAMID_LEVELS), output_size=ROI_OUTPUT_SIZE, sampling_ratio=2),
        box_head=TwoMLPHead(fpn_channels * ROI_OUTPUT_SIZE**2, representation_size),
        box_predictor=FastRCNNPredictor(representation_size, num_classes),
        box_batch_size_per_image=box_batch_size_per_image,
        box_detections_per_img=box_detections_per_img,
    )


def sample_shape(in_channels: int = 16, image_height: int = 768, image_width: int = 1152, **_: object):
    return (in_channels, image_height, image_width)


class CountedWork(nn.Module):
    """The detector's counted work on a dense batch of images: backbone and pyramid, the RPN head on
    every level, and the box head and predictor on a fixed number of regions per image
    (``box_batch_size_per_image`` in training, ``rpn_post_nms_top_n_test`` in evaluation)."""

    def __init__(self, **options):
        super().__init__()
        detector = build(**options)
        self.backbone, self.rpn_head = detector.backbone, detector.rpn.head
        self.box_head, self.box_predictor = detector.roi_heads.box_head, detector.roi_heads.box_predictor
        detector.rpn.eval()  # its post_nms_top_n() is the evaluation count in eval mode
        # Regions per image by mode (self.training): sampled in training, proposed in evaluation.
        self.regions = {
            True: detector.roi_heads.fg_bg_sampler.batch_size_per_image,
            False: detector.rpn.post_nms_top_n(),
        }

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        levels = list(self.backbone(images).values())
        objectness, box_deltas = self.rpn_head(levels)
        # RoIAlign's output: pooled pyramid features of every region, which the gradient reaches in training.
        regions = torch.zeros(
            images.shape[0] * self.regions[self.training],
            self.backbone.out_channels,
            ROI_OUTPUT_SIZE,
            ROI_OUTPUT_SIZE,
            device=images.device,
            requires_grad=self.training,
        )
        scores, boxes = self.box_predictor(self.box_head(regions))
        return sum(t.sum() for t in (*objectness, *box_deltas, scores, boxes))


class SumOfLosses(nn.Module):
    """The training loss of a torchvision detector: the sum of the loss dict its forward returns."""

    def forward(self, losses: dict[str, torch.Tensor], targets: list[dict]) -> torch.Tensor:
        return torch.stack(list(losses.values())).sum()


def criterion(training: dict) -> nn.Module:
    return SumOfLosses()


def collate(samples: list[tuple[torch.Tensor, dict]]) -> tuple[torch.Tensor, list[dict]]:
    """A batch: the images stacked (all have the model's input size), the targets as a list (box counts differ)."""
    images, targets = zip(*samples, strict=True)
    return torch.stack(images), list(targets)


def quality_metric():
    from torchmetrics.detection import MeanAveragePrecision

    # Synchronised by the trial (every rank's outputs gathered first), not by torchmetrics.
    return MeanAveragePrecision(iou_thresholds=[0.5], sync_on_compute=False)


def eval_finalize(values: dict[str, float]) -> dict[str, float]:
    return {"map50": values["map"]}


SPEC = ModelSpec(
    build=build,
    sample_shape=sample_shape,
    criterion=criterion,
    eval_sums=None,
    eval_finalize=eval_finalize,
    forward_takes_targets=True,
    collate=collate,
    quality_metric=quality_metric,
    counted_work=CountedWork,
)
