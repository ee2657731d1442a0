"""An image's EXIF orientation, read and applied with TensorFlow ops, so that the exported model turns
a photo upright as OpenCV's ``cv2.imread`` (what ``maskrcnn predict`` reads with) does.

Cameras and phones store the sensor's pixels as they came and record in the Exif APP1 segment's
first image file directory (IFD0) which way is up: tag 0x0112, Orientation, values 1 to 8 (Exif 2.3,
section 4.6.4, table "Orientation"); a PNG may carry the same data in an ``eXIf`` chunk before its
image data. TensorFlow's decoders ignore it; OpenCV 4.11 applies it for both formats unless told
not to (IMREAD_IGNORE_ORIENTATION).
"""
from __future__ import annotations

ORIENTATION_TAG = 0x0112
EXIF_HEADER = b"Exif\x00\x00"
# A JPEG's Exif segment is an APP1 segment of at most 64 KiB right after the start of the file (maybe
# after a JFIF APP0): the first 128 KiB hold it. A PNG's eXIf chunk behind 128 KiB of other chunks
# (a large ICC profile) is not seen.
HEAD_BYTES = 128 * 1024
SOS, EOI, APP1 = 0xDA, 0xD9, 0xE1
JPEG_SIGNATURE, PNG_SIGNATURE = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"


def orientation(tf, image_bytes):
    """The Orientation value (int32, 1..8) of a JPEG or PNG file's bytes; 1 when it has none, when
    the Exif data are malformed or out of range (OpenCV then leaves the image as stored), or for
    another format."""
    head = tf.io.decode_raw(tf.strings.substr(image_bytes, 0, HEAD_BYTES), tf.uint8)
    n = tf.size(head)
    # zero padding: reads past the end (of a truncated segment) see zeros instead of failing
    data = tf.cast(tf.concat([head, tf.zeros([16], tf.uint8)], 0), tf.int32)

    def byte(i):
        return tf.gather(data, tf.clip_by_value(i, 0, n + 15))

    def matches(pos, text: bytes):
        got = tf.gather(data, tf.clip_by_value(pos + tf.range(len(text)), 0, n + 15))
        return tf.reduce_all(tf.equal(got, tf.constant(list(text), tf.int32)))

    def u32be(i):
        return byte(i) * 16777216 + byte(i + 1) * 65536 + byte(i + 2) * 256 + byte(i + 3)

    # JPEG: segments from the start-of-image marker, FF <marker> <16-bit big-endian length>, up to
    # the image data (SOS); the Exif segment is an APP1 whose data begin with "Exif\0\0".
    def jpeg_more(pos, found):
        return (found < 0) & (pos + 4 <= n) & tf.equal(byte(pos), 0xFF) \
            & tf.not_equal(byte(pos + 1), SOS) & tf.not_equal(byte(pos + 1), EOI)

    def jpeg_step(pos, found):
        marker = byte(pos + 1)
        length = byte(pos + 2) * 256 + byte(pos + 3)
        found = tf.where(tf.equal(marker, APP1) & matches(pos + 4, EXIF_HEADER), pos + 10, found)
        # FF FF is fill before a marker: one byte on; a length under 2 is malformed: stop there
        pos = tf.where(tf.equal(marker, 0xFF), pos + 1, tf.where(length >= 2, pos + 2 + length, n))
        return pos, found

    # PNG: chunks after the signature, <32-bit big-endian length> <type> <data> <CRC>, up to the
    # image data (IDAT); the eXIf chunk's data are the TIFF structure itself.
    def png_more(pos, found):
        return (found < 0) & (pos + 8 <= n) & tf.logical_not(matches(pos + 4, b"IDAT") | matches(pos + 4, b"IEND"))

    def png_step(pos, found):
        # some writers keep JPEG's "Exif\0\0" in front of the TIFF structure
        start = tf.where(matches(pos + 8, EXIF_HEADER), pos + 14, pos + 8)
        found = tf.where(matches(pos + 4, b"eXIf"), start, found)
        length = u32be(pos)
        return tf.where(length >= 0, pos + 12 + length, n), found   # a length over 2**31 wraps: stop

    def walk(more, step, start):
        return tf.while_loop(more, step, (tf.constant(start), tf.constant(-1)),
                             maximum_iterations=HEAD_BYTES // 4)[1]

    tiff = tf.case([(matches(0, JPEG_SIGNATURE), lambda: walk(jpeg_more, jpeg_step, 2)),
                    (matches(0, PNG_SIGNATURE), lambda: walk(png_more, png_step, 8))],
                   default=lambda: tf.constant(-1))

    def read_tiff():
        little = tf.equal(byte(tiff), 0x49) & tf.equal(byte(tiff + 1), 0x49)     # "II", else "MM"

        def u16(i):
            return tf.where(little, byte(i) + 256 * byte(i + 1), 256 * byte(i) + byte(i + 1))

        def u32(i):
            return tf.where(little, u16(i) + 65536 * u16(i + 2), 65536 * u16(i) + u16(i + 2))

        ifd0 = tiff + u32(tiff + 4)
        entries = ifd0 + 2 + 12 * tf.range(u16(ifd0))     # 12-byte entries: tag, type, count, value
        entries = tf.boolean_mask(entries, entries + 12 <= n)
        tags = u16(entries)
        hits = tf.boolean_mask(entries, tf.equal(tags, ORIENTATION_TAG))
        # a SHORT value sits in the first two bytes of the entry's value field
        value = tf.cond(tf.size(hits) > 0, lambda: u16(hits[0] + 8), lambda: tf.constant(1))
        return tf.where((value >= 1) & (value <= 8), value, 1)

    return tf.cond(tiff >= 0, read_tiff, lambda: tf.constant(1))


def apply_orientation(tf, image, value):
    """``image`` [H, W, C] as it is meant to be seen, for an Orientation ``value`` (1..8): the
    stored pixels' row 0 is the visual top (1, 2), bottom (3, 4), left side (5, 6) or right side
    (7, 8), and a value of 2, 4, 5 or 7 also mirrors it."""
    def transposed():
        return tf.transpose(image, [1, 0, 2])

    branches = [
        lambda: image,                                    # 1: as stored
        lambda: tf.reverse(image, [1]),                   # 2: mirrored left to right
        lambda: tf.reverse(image, [0, 1]),                # 3: turned 180 degrees
        lambda: tf.reverse(image, [0]),                   # 4: mirrored top to bottom
        transposed,                                       # 5: mirrored along the main diagonal
        lambda: tf.reverse(transposed(), [1]),            # 6: turned 90 degrees clockwise to view
        lambda: tf.reverse(transposed(), [0, 1]),         # 7: mirrored along the other diagonal
        lambda: tf.reverse(transposed(), [0]),            # 8: turned 90 degrees counter-clockwise to view
    ]
    return tf.switch_case(value - 1, branches)
