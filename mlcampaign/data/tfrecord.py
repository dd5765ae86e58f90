"""TFRecord files of ``tf.train.Example`` protos, read and written without TensorFlow.

A TFRecord file is a sequence of records, each ``uint64 length | uint32 masked-CRC32C of the
length | data | uint32 masked-CRC32C of the data`` (little-endian), optionally gzip-compressed
as a whole. An Example is the protobuf ``Example{Features features = 1}``,
``Features{map<string, Feature> feature = 1}``, ``Feature{oneof BytesList bytes_list = 1;
FloatList float_list = 2; Int64List int64_list = 3}``, each list holding ``repeated value = 1``
(floats and int64s packed, as TensorFlow writes them; unpacked ones are read too).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import google_crc32c
import numpy as np

from mlcampaign.data.manifest import DatasetError

_GZIP_MAGIC = b"\x1f\x8b"
_MASK_DELTA = 0xA282EAD8
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_BYTES_LIST, _FLOAT_LIST, _INT64_LIST = 1, 2, 3

# A single-value BytesList decodes to bytes, a longer one to a list of bytes.
FeatureValue = bytes | list[bytes] | np.ndarray


class TFRecordError(DatasetError):
    """A TFRecord file is truncated, fails its checksums or does not hold a valid Example."""


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# -- records ---------------------------------------------------------------------------------
def write_records(path: Path, records: Sequence[bytes], compress: bool = True) -> None:
    """Write ``records`` to ``path``, gzip-compressed like TensorFlow's ``GZIP`` option (zlib's default
    level 6), with a zero mtime so equal records give equal bytes."""
    frames = []
    for data in records:
        length = struct.pack("<Q", len(data))
        frames += [length, struct.pack("<I", masked_crc32c(length)), data, struct.pack("<I", masked_crc32c(data))]
    payload = b"".join(frames)
    Path(path).write_bytes(gzip.compress(payload, compresslevel=6, mtime=0) if compress else payload)


def read_records(path: Path) -> Iterator[bytes]:
    """The records of a (gzip-compressed or plain) TFRecord file, checksums verified."""
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as handle:
            yield from _records(path, handle)
    except (OSError, EOFError, zlib.error) as error:
        raise TFRecordError(f"{path}: corrupted gzip stream: {error}") from error


def _records(path: Path, handle) -> Iterator[bytes]:
    offset = 0
    while header := handle.read(12):
        if len(header) < 12:
            raise TFRecordError(f"{path}: truncated record header at byte {offset}")
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:])
        if masked_crc32c(header[:8]) != length_crc:
            raise TFRecordError(f"{path}: length checksum mismatch at byte {offset}")
        data = handle.read(length)
        footer = handle.read(4)
        if len(data) < length or len(footer) < 4:
            raise TFRecordError(f"{path}: truncated record at byte {offset} (expected {length} data bytes)")
        if masked_crc32c(data) != struct.unpack("<I", footer)[0]:
            raise TFRecordError(f"{path}: data checksum mismatch in the record at byte {offset}")
        offset += 16 + length
        yield data


# -- protobuf wire format --------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _read_varint(buffer: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(buffer):
            raise TFRecordError("varint runs past the end of its message")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _fields(buffer: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of a protobuf message; length-delimited values as views."""
    position = 0
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, position = _read_varint(buffer, position)
        elif wire_type in (_FIXED64, _FIXED32):
            size = 8 if wire_type == _FIXED64 else 4
            value, position = buffer[position : position + size], position + size
        elif wire_type == _LENGTH_DELIMITED:
            size, position = _read_varint(buffer, position)
            value, position = buffer[position : position + size], position + size
        else:
            raise TFRecordError(f"unsupported protobuf wire type {wire_type} in field {number}")
        if position > len(buffer):
            raise TFRecordError(f"field {number} runs past the end of its message")
        yield number, wire_type, value


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialise a ``tf.train.Example``.

    ``bytes`` (or a list of them) become a BytesList, float arrays a FloatList, integer arrays
    an Int64List; features are written in name order, so equal inputs give equal bytes.
    """
    entries = []
    for name, value in sorted(features.items()):
        if isinstance(value, bytes | list):
            items = [value] if isinstance(value, bytes) else value
            feature = _field(_BYTES_LIST, b"".join(_field(1, item) for item in items))
        elif np.issubdtype(value.dtype, np.floating):
            feature = _field(_FLOAT_LIST, _field(1, np.asarray(value, dtype="<f4").tobytes()))
        else:
            packed = b"".join(_varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in np.ravel(value))
            feature = _field(_INT64_LIST, _field(1, packed))
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))


def _decode_list(kind: int, message: memoryview) -> FeatureValue:
    values: list = []
    for number, wire_type, value in _fields(message):
        if number != 1:
            continue
        if kind == _BYTES_LIST:
            values.append(bytes(value))
        elif kind == _FLOAT_LIST:
            values.append(np.frombuffer(value, dtype="<f4"))
        elif wire_type == _LENGTH_DELIMITED:  # packed int64s
            position = 0
            while position < len(value):
                item, position = _read_varint(value, position)
                values.append(np.array([item], dtype=np.uint64).view(np.int64))
        else:
            values.append(np.array([value], dtype=np.uint64).view(np.int64))
    if kind == _BYTES_LIST:
        return values[0] if len(values) == 1 else values
    empty = np.empty(0, dtype=np.float32 if kind == _FLOAT_LIST else np.int64)
    return np.concatenate(values) if values else empty


def decode_example(data: bytes) -> dict[str, FeatureValue]:
    """Parse a serialised ``tf.train.Example`` into {name: bytes or numpy array}."""
    features: dict[str, FeatureValue] = {}
    for number, _, message in _fields(memoryview(data)):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(message):
            if entry_number != 1:
                continue
            name, feature = "", None
            for part_number, _, part in _fields(entry):
                if part_number == 1:
                    name = bytes(part).decode()
                elif part_number == 2:
                    feature = part
            for kind, _, payload in _fields(feature if feature is not None else memoryview(b"")):
                if kind in (_BYTES_LIST, _FLOAT_LIST, _INT64_LIST):
                    features[name] = _decode_list(kind, payload)
    return features
