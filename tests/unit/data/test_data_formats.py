"""Real dataset formats: TFRecord/Example codec, generators writing them, readers reading them."""

import gzip
import struct
import time

import h5py
import numpy as np
import pytest
import torch

from mlcampaign.benchmarks.cosmoflow.generator import cosmoflow_universe, cosmoflow_universes
from mlcampaign.benchmarks.deepcam.generator import deepcam_climate, deepcam_snapshot
from mlcampaign.data.formats import open_split
from mlcampaign.data.manifest import DatasetError, build_manifest
from mlcampaign.data.tfrecord import (
    TFRecordError,
    decode_example,
    encode_example,
    masked_crc32c,
    read_records,
    write_records,
)
from mlcampaign.plan import registry

COSMO_SHAPE = (4, 32, 32, 32)
DEEPCAM_SHAPE = (16, 32, 48)


# -- TFRecord and tf.train.Example -------------------------------------------------------------
def test_masked_crc32c_matches_the_crc32c_check_value_and_tensorflows_mask():
    import google_crc32c

    assert google_crc32c.value(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_record_framing_is_length_crc_data_crc(tmp_path):
    path = tmp_path / "plain.tfrecord"
    write_records(path, [b"abc"], compress=False)
    raw = path.read_bytes()
    assert raw[:8] == struct.pack("<Q", 3)
    assert raw[8:12] == struct.pack("<I", masked_crc32c(raw[:8]))
    assert raw[12:15] == b"abc"
    assert raw[15:] == struct.pack("<I", masked_crc32c(b"abc"))


def test_records_round_trip_plain_and_gzip(tmp_path):
    records = [b"first", b"", bytes(range(256)) * 100]
    for compress in (False, True):
        path = tmp_path / f"r{compress}.tfrecord"
        write_records(path, records, compress=compress)
        assert (path.read_bytes()[:2] == b"\x1f\x8b") == compress
        assert list(read_records(path)) == records


def test_example_round_trip():
    features = {
        "x": np.arange(24, dtype="<i2").tobytes(),
        "y": np.array([0.5, -1.25, 3.0, 1e-7], dtype=np.float32),
        "ids": np.array([0, 1, -3, 2**40], dtype=np.int64),
        "names": [b"a", b"bc"],
    }
    decoded = decode_example(encode_example(features))
    assert decoded["x"] == features["x"]
    assert decoded["names"] == features["names"]
    np.testing.assert_array_equal(decoded["y"], features["y"])
    np.testing.assert_array_equal(decoded["ids"], features["ids"])


def _example_class():
    """tf.train.Example built from its .proto definition with the protobuf runtime (no TensorFlow)."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="example.proto", package="tensorflow", syntax="proto3")
    for name, kind in (
        ("BytesList", field.TYPE_BYTES),
        ("FloatList", field.TYPE_FLOAT),
        ("Int64List", field.TYPE_INT64),
    ):
        proto.message_type.add(name=name).field.add(name="value", number=1, type=kind, label=field.LABEL_REPEATED)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), start=1
    ):
        feature.field.add(
            name=name, number=number, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
            type_name=f".tensorflow.{type_name}", oneof_index=0,
        )  # fmt: skip
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    entry.field.add(
        name="value", number=2, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL, type_name=".tensorflow.Feature"
    )
    features.field.add(
        name="feature", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED,
        type_name=".tensorflow.Features.FeatureEntry",
    )  # fmt: skip
    proto.message_type.add(name="Example").field.add(
        name="features", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL, type_name=".tensorflow.Features"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def test_example_codec_agrees_with_the_protobuf_runtime():
    example_class = _example_class()
    x, y = np.arange(10, dtype="<i2").tobytes(), np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    ours = encode_example({"x": x, "y": y})
    parsed = example_class.FromString(ours)
    assert parsed.features.feature["x"].bytes_list.value == [x]
    assert list(parsed.features.feature["y"].float_list.value) == pytest.approx(y.tolist())
    # And the other way: protobuf's serialisation (packed floats and int64s, as TensorFlow writes) decodes.
    theirs = example_class()
    theirs.features.feature["x"].bytes_list.value.append(x)
    theirs.features.feature["y"].float_list.value.extend(y.tolist())
    theirs.features.feature["n"].int64_list.value.extend([7, -2])
    decoded = decode_example(theirs.SerializeToString())
    assert decoded["x"] == x
    np.testing.assert_array_equal(decoded["y"], y)
    np.testing.assert_array_equal(decoded["n"], [7, -2])
    # Byte for byte: protobuf's deterministic serialisation orders map entries by key, as we do.
    del theirs.features.feature["n"]
    assert ours == theirs.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda raw: raw[:-3], "truncated record"),
        (lambda raw: raw[:12] + bytes([raw[12] ^ 1]) + raw[13:], "data checksum mismatch"),
        (lambda raw: raw[:3] + bytes([raw[3] ^ 1]) + raw[4:], "length checksum mismatch"),
    ],
)
def test_damaged_records_are_reported_with_the_file_name(tmp_path, damage, message):
    path = tmp_path / "sample.tfrecord"
    write_records(path, [b"payload" * 10], compress=False)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(TFRecordError, match=f"sample.tfrecord.*{message}"):
        list(read_records(path))


def test_a_broken_gzip_stream_is_reported_with_the_file_name(tmp_path):
    path = tmp_path / "sample.tfrecord"
    write_records(path, [b"payload" * 1000], compress=True)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(TFRecordError, match=r"sample\.tfrecord: corrupted gzip stream"):
        list(read_records(path))


# -- generators and readers --------------------------------------------------------------------
@pytest.mark.parametrize("data_format", ["cosmoflow_tfrecord", "cosmoflow_hdf5", "cosmoflow_numpy"])
def test_cosmoflow_formats_hold_the_same_samples_and_are_reproducible(tmp_path, data_format):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        registry.generators()["cosmoflow_universes"].write(
            out, data_format, seed=3, train_samples=3, val_samples=2, size=32
        )
    assert (
        build_manifest(first, "c", data_format)["dataset_id"] == build_manifest(second, "c", data_format)["dataset_id"]
    )
    assert sorted(p.name for p in (first / "validation").iterdir())[0].startswith("univ_synthetic_00000")
    train = open_split(data_format, first, "train", COSMO_SHAPE)
    assert len(train) == 3 and len(open_split(data_format, first, "val", COSMO_SHAPE)) == 2
    x, y = train[1]
    counts, params = cosmoflow_universe(np.random.default_rng([3, 0, 1]), 32)
    assert x.shape == COSMO_SHAPE and x.dtype == torch.float32 and y.shape == (4,)
    torch.testing.assert_close(x, torch.from_numpy(np.log1p(np.moveaxis(counts, -1, 0).astype(np.float32))))
    torch.testing.assert_close(y, torch.from_numpy(params))


def test_cosmoflow_tfrecord_is_a_gzip_file_of_one_example(tmp_path):
    cosmoflow_universes(tmp_path, "cosmoflow_tfrecord", train_samples=1, val_samples=1, size=32)
    path = next((tmp_path / "train").glob("*.tfrecord"))
    with gzip.open(path) as handle:
        assert handle.read(8) == struct.pack("<Q", len(next(read_records(path))))
    example = decode_example(next(read_records(path)))
    assert len(example["x"]) == 32**3 * 4 * 2 and example["y"].dtype == np.float32 and len(example["y"]) == 4


def test_cosmoflow_reader_names_a_file_of_the_wrong_size(tmp_path):
    cosmoflow_universes(tmp_path, "cosmoflow_tfrecord", train_samples=1, val_samples=1, size=32)
    with pytest.raises(DatasetError, match=r"univ_synthetic_00000.tfrecord: feature 'x' holds 131072 values, expected"):
        open_split("cosmoflow_tfrecord", tmp_path, "train", (4, 64, 64, 64))[0]


def test_cosmoflow_reader_rejects_files_of_several_samples_or_without_features(tmp_path):
    (tmp_path / "train").mkdir()
    example = encode_example({"x": np.zeros(32**3 * 4, dtype="<i2").tobytes(), "y": np.zeros(4, np.float32)})
    write_records(tmp_path / "train" / "two.tfrecord", [example, example])
    write_records(tmp_path / "train" / "zz.tfrecord", [encode_example({"y": np.zeros(4, np.float32)})])
    samples = open_split("cosmoflow_tfrecord", tmp_path, "train", COSMO_SHAPE)
    with pytest.raises(DatasetError, match=r"two\.tfrecord: holds more than one sample"):
        samples[0]
    with pytest.raises(DatasetError, match=r"zz.tfrecord: the Example has no feature 'x'"):
        samples[1]


def test_cosmoflow_parameters_are_recoverable_from_simple_statistics():
    """A real signal: per-channel means and spreads of log counts predict each parameter (linear fit)."""
    rows, targets = [], []
    for index in range(120):
        counts, params = cosmoflow_universe(np.random.default_rng([9, index]), 32)
        logs = np.log1p(counts.astype(np.float64)).reshape(-1, 4)
        roughness = np.abs(np.diff(np.log1p(counts[..., 0].astype(np.float64)), axis=0)).mean()
        rows.append(np.concatenate([logs.mean(0), logs.std(0), [roughness, 1.0]]))
        targets.append(params)
    features, targets = np.array(rows), np.array(targets)
    train, test = slice(0, 90), slice(90, None)
    coefficients, *_ = np.linalg.lstsq(features[train], targets[train], rcond=None)
    mae = np.abs(features[test] @ coefficients - targets[test]).mean(axis=0)
    assert (mae < 0.35).all(), mae  # guessing 0 gives 0.5 for uniform parameters in [-1, 1]


def test_deepcam_files_stats_and_normalisation(tmp_path):
    deepcam_climate(tmp_path, seed=1, train_samples=3, val_samples=2, height=32, width=48)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.h5", "train", "validation"]
    with h5py.File(next((tmp_path / "train").glob("*.h5"))) as handle:
        assert handle["climate/data"].shape == (32, 48, 16) and handle["climate/data"].dtype == np.float32
        assert handle["climate/labels_0"].shape == (32, 48)
    train = open_split("deepcam_hdf5", tmp_path, "train", DEEPCAM_SHAPE)
    inputs = torch.stack([train[i][0] for i in range(len(train))])
    assert inputs.shape == (3, *DEEPCAM_SHAPE)
    # stats.h5 holds the training set's per-channel extremes: normalised training data spans [0, 1].
    torch.testing.assert_close(inputs.amin(dim=(0, 2, 3)), torch.zeros(16))
    torch.testing.assert_close(inputs.amax(dim=(0, 2, 3)), torch.ones(16))
    assert train[0][1].dtype == torch.int64 and set(train[0][1].unique().tolist()) <= {0, 1, 2}
    time.sleep(1.1)  # HDF5 can stamp creation times in seconds; files written later must not differ
    first = tmp_path.with_name("again")
    deepcam_climate(first, seed=1, train_samples=3, val_samples=2, height=32, width=48)
    assert (
        build_manifest(first, "d", "deepcam_hdf5")["dataset_id"]
        == build_manifest(tmp_path, "d", "deepcam_hdf5")["dataset_id"]
    )


def test_deepcam_events_carry_their_physical_signatures():
    """A real signal: cyclones are low-pressure discs, rivers high-moisture bands."""
    data, labels = deepcam_snapshot(np.random.default_rng(0), 96, 144, cyclones=2, rivers=2)
    assert {0, 1, 2} <= set(np.unique(labels).tolist())
    psl, tmq = data[..., 7], data[..., 0]
    assert psl[labels == 1].mean() < psl[labels == 0].mean() - 1000.0  # Pa
    assert tmq[labels == 2].mean() > tmq[labels == 0].mean() + 20.0  # kg m-2


def test_deepcam_reader_names_mismatched_files(tmp_path):
    deepcam_climate(tmp_path, train_samples=1, val_samples=1, height=32, width=48)
    with pytest.raises(DatasetError, match=r"data-synthetic-00000.h5: climate/data \(32, 48, 16\)"):
        open_split("deepcam_hdf5", tmp_path, "train", (16, 64, 48))[0]
    (tmp_path / "stats.h5").unlink()
    with pytest.raises(DatasetError, match=r"stats\.h5: missing"):
        open_split("deepcam_hdf5", tmp_path, "train", DEEPCAM_SHAPE)


def test_an_empty_split_is_named(tmp_path):
    (tmp_path / "validation").mkdir()
    with pytest.raises(DatasetError, match=r"validation: no \*\.h5 files"):
        open_split("deepcam_hdf5", tmp_path, "val", DEEPCAM_SHAPE)
