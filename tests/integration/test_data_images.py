"""Images of vision-language rows: every accepted form decodes to the same pixels, within the pixel bound; every
bad image and every placeholder mismatch is a DataError naming the file, the row and the field, at parse time."""

from __future__ import annotations

import base64
import io
import json
import os
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

from oxrl.config.schema import DatasetSpec
from oxrl.data.errors import DataError
from oxrl.data.formats import Chat, Plain, parse_row, prompt_messages_with_images
from oxrl.data.images import ImageError, decode_image
from oxrl.data.read import read_dataset
from tests.hostile_files import make_fifo, raised_within

IMAGE = {"type": "image"}


def picture(width: int = 6, height: int = 4) -> Image.Image:
    """An RGB image whose every pixel differs, so that any mix-up of pixels shows."""
    image = Image.new("RGB", (width, height))
    image.putdata([(10 * x, 20 * y, 5 * (x + y)) for y in range(height) for x in range(width)])
    return image


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def parse(fmt: str, values: dict, **kwargs):
    chat_template = kwargs.pop("chat_template", True)
    return parse_row(fmt, values, location="rows.jsonl", row=3, chat_template=chat_template, **kwargs)


# ---------------------------------------------------------------------------------------------
# Decoding


def test_every_accepted_form_decodes_to_the_same_pixels(tmp_path, monkeypatch):
    drawn = picture()
    encoded = png_bytes(drawn)
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(encoded)
    monkeypatch.setenv("HOME", str(tmp_path))
    b64 = base64.b64encode(encoded).decode()
    forms = {
        "absolute path": str(tmp_path / "pics" / "a.png"),
        "relative path": "pics/a.png",
        "home path": "~/pics/a.png",
        "bytes": encoded,
        "base64": b64,
        "base64 with line breaks": base64.encodebytes(encoded).decode(),
        "data URI": "data:image/png;base64," + b64,
        "datasets bytes": {"bytes": encoded, "path": None},
        "datasets path": {"bytes": None, "path": "pics/a.png"},
        "datasets bytes win": {"bytes": encoded, "path": "no/such/file.png"},
        "PIL image": drawn,
        "PIL palette image": drawn.convert("P", palette=Image.Palette.ADAPTIVE, colors=256),
    }
    for name, value in forms.items():
        decoded = decode_image(value, root=tmp_path, max_pixels=1000)
        assert decoded.mode == "RGB", name
        assert decoded.size == (6, 4), name
        assert list(decoded.getdata()) == list(drawn.getdata()), name
    assert list(drawn.getdata())[7] == (10, 20, 10)  # the picture itself is what it was drawn as


def test_big_images_are_scaled_down_within_the_bound_keeping_their_shape():
    big = decode_image(picture(400, 300), root=None, max_pixels=10_000)
    width, height = big.size
    assert width * height <= 10_000
    assert abs(height - width * 300 / 400) <= 1
    assert big.size == (115, 86)  # by hand: scale sqrt(10000 / 120000) = 0.2887; 115.5 and 86.6, rounded down
    thin = decode_image(picture(1000, 1), root=None, max_pixels=100)
    assert thin.size == (100, 1)  # the 1-pixel side cannot shrink; the other takes the whole bound


def test_small_images_are_untouched():
    small = picture(40, 30)
    decoded = decode_image(png_bytes(small), root=None, max_pixels=10_000)
    assert decoded.size == (40, 30)
    assert list(decoded.getdata()) == list(small.getdata())


def test_the_callers_image_is_not_modified():
    drawn = picture(400, 300)
    decode_image(drawn, root=None, max_pixels=100)
    assert drawn.size == (400, 300)


def bomb_png() -> bytes:
    """A valid PNG header announcing 30000 x 30000 pixels: PIL refuses it before reading any pixel."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 30_000, 30_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def bad_images(tmp_path: Path) -> list[tuple[object, str]]:
    (tmp_path / "notes.png").write_text("not a picture")
    encoded = png_bytes(picture(40, 30))
    b64 = base64.b64encode(encoded).decode()
    return [
        ("missing.png", f"file not found: {tmp_path / 'missing.png'}"),
        ("notes.png", "not an image (cannot identify image file)"),
        (b64[: len(b64) // 2 // 4 * 4 + 1], "not a valid base64 string"),  # cut where no base64 can end
        (b64[: len(b64) // 2 // 4 * 4], "broken or truncated image data"),  # valid base64 of half a PNG
        ("data:image/png;base64,@@@@", "not a valid data URI"),
        ("data:text/plain,hello", "a data URI must start data:image/<type>;base64"),
        (5, "expected a path, bytes, a base64 string or data URI, or an image, got int"),
        ({"path": None, "bytes": None}, "an image object needs `bytes` or a `path`"),
        (bomb_png(), "refused as a decompression bomb"),
        # As `datasets` gives an Image column it decodes: opened (the header read), the pixels not yet.
        (Image.open(io.BytesIO(encoded[: len(encoded) // 2])), "broken or truncated image data"),
    ]


def test_bad_images_name_the_file_the_row_and_the_item(tmp_path):
    good = png_bytes(picture())
    for bad, problem in bad_images(tmp_path):
        values = {"prompt": "<image><image>Which differs?", "response": "the second", "images": [good, bad]}
        with pytest.raises(DataError) as caught:
            parse("prompt_response", values, image_root=tmp_path)
        assert caught.value.path == "rows.jsonl" and caught.value.row == 3 and caught.value.field == "images[1]"
        assert problem in caught.value.problem
        assert str(caught.value).startswith("rows.jsonl, row 3, field 'images[1]': ")


def test_decode_image_alone_raises_image_error(tmp_path):
    with pytest.raises(ImageError, match="file not found"):
        decode_image("missing.png", root=tmp_path, max_pixels=100)


def test_images_column_of_the_wrong_type():
    with pytest.raises(DataError, match=r"rows.jsonl, row 3, field 'images': expected a list of images, got int"):
        parse("prompt_response", {"prompt": "q", "response": "r", "images": 7})


def test_a_single_image_is_a_list_of_one():
    parsed = parse("prompt_response", {"prompt": "Describe.", "response": "dots", "images": png_bytes(picture())})
    assert len(parsed.images) == 1


# ---------------------------------------------------------------------------------------------
# Placeholders


def test_image_markers_split_the_prompt_into_parts():
    images = [png_bytes(picture()), png_bytes(picture(3, 3))]
    parsed = parse("prompt_response", {"prompt": "Compare <image> and <image>.", "response": "same", "images": images})
    assert parsed.sequences == [Chat([
        {"role": "user", "content": [text("Compare "), IMAGE, text(" and "), IMAGE, text(".")]},
        {"role": "assistant", "content": "same"},
    ], first_trained=1)]
    assert [image.size for image in parsed.images] == [(6, 4), (3, 3)]  # in placeholder order


def test_a_leading_marker_makes_no_empty_text_part():  # Geometry3K / verl: "<image>Find x."
    assert prompt_messages_with_images("<image>Find x.", 1, "rows.jsonl", 3) == [
        {"role": "user", "content": [IMAGE, text("Find x.")]}
    ]


def test_images_without_placeholders_open_the_first_user_message():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is shown?"},
        {"role": "assistant", "content": "Two dots."},
        {"role": "user", "content": "Colours?"},
        {"role": "assistant", "content": "Red."},
    ]
    parsed = parse("messages", {"messages": messages, "images": [png_bytes(picture())] * 2})
    expected = [messages[0], {"role": "user", "content": [IMAGE, IMAGE, text("What is shown?")]}, *messages[2:]]
    assert parsed.sequences == [Chat(expected)]
    assert len(parsed.images) == 2


def test_image_parts_are_kept_where_they_are():
    messages = [{"role": "user", "content": [text("Look:"), {"type": "image", "text": None}]},
                {"role": "assistant", "content": [text("A dot.")]}]
    parsed = parse("messages", {"messages": messages, "images": [png_bytes(picture())]})
    # The null that `datasets` gives a part without `text` is dropped, as it is for messages.
    assert parsed.sequences[0].messages == [{"role": "user", "content": [text("Look:"), IMAGE]}, messages[1]]


def test_placeholder_count_must_match_the_images():
    values = {"prompt": "<image> <image> <image> Which is odd?", "response": "b", "images": [png_bytes(picture())] * 2}
    with pytest.raises(DataError) as caught:
        parse("prompt_response", values)
    assert caught.value.field == "images"
    assert "3 image placeholders" in caught.value.problem and "but 2 images" in caught.value.problem


def test_image_parts_without_images_are_refused():
    messages = [{"role": "user", "content": [IMAGE, text("What?")]}, {"role": "assistant", "content": "A dot."}]
    with pytest.raises(DataError, match=r"row 3, field 'images': missing field, but the messages hold 1 image"):
        parse("messages", {"messages": messages})
    with pytest.raises(DataError, match=r"field 'images': an empty list, but the messages hold 1 image"):
        parse("messages", {"messages": messages, "images": []})


def test_without_images_the_marker_is_plain_text():
    parsed = parse("prompt_response", {"prompt": "What does <image> mean in HTML?", "response": "nothing"},
                   chat_template=False)
    assert parsed.sequences == [Plain("What does <image> mean in HTML?", "nothing")]
    assert parsed.images == []


def test_images_in_an_assistant_message_are_refused():
    image = png_bytes(picture())
    as_part = [{"role": "user", "content": "Draw."}, {"role": "assistant", "content": [IMAGE]}]
    with pytest.raises(DataError, match=r"field 'messages\[1\].content\[0\]': assistant messages may not hold images"):
        parse("messages", {"messages": as_part, "images": [image]})
    as_marker = [{"role": "user", "content": "Draw."}, {"role": "assistant", "content": "Here: <image>"}]
    with pytest.raises(DataError, match=r"field 'messages\[1\].content': assistant messages may not hold images"):
        parse("messages", {"messages": as_marker, "images": [image]})
    with pytest.raises(DataError, match=r"field 'chosen\[0\].content\[0\]': assistant messages may not hold images"):
        parse("preference", {"prompt": "Draw.", "chosen": [{"role": "assistant", "content": [IMAGE]}],
                             "rejected": "no", "images": [image]})


def test_images_on_a_text_row_are_refused():
    with pytest.raises(DataError, match=r"row 3, field 'images': a `text` row cannot carry images"):
        parse("text", {"text": "Once upon a time", "images": [png_bytes(picture())]})


def test_images_need_the_chat_template():
    values = {"prompt": "<image>What?", "response": "A dot.", "images": [png_bytes(picture())]}
    with pytest.raises(DataError, match=r"field 'images': images need the chat template"):
        parse("prompt_response", values, chat_template=False)


@pytest.mark.parametrize(
    "content, field, problem",
    [
        ([], "messages[0].content", "empty list of content parts"),
        (["hi"], "messages[0].content[0]", "expected a content part {type, ...}, got a string"),
        ([text("a"), {"type": "video"}], "messages[0].content[1].type", "unknown content part type 'video'"),
        ([{"text": "a"}], "messages[0].content[0].type", "unknown content part type None"),
        ([{"type": "text"}], "messages[0].content[0].text", "missing field"),
        ([text(" ")], "messages[0].content[0].text", "empty string"),
        ([{"type": "text", "text": 3}], "messages[0].content[0].text", "expected a string, got a number (3)"),
    ],
)
def test_malformed_content_parts(content, field, problem):
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(DataError) as caught:
        parse("messages", {"messages": messages})
    assert (caught.value.field, caught.value.row) == (field, 3)
    assert problem in caught.value.problem


def test_text_only_parts_need_no_images():
    messages = [{"role": "user", "content": [text("hi")]}, {"role": "assistant", "content": "yo"}]
    assert parse("messages", {"messages": messages}).sequences == [Chat(messages)]


def test_a_preference_pair_shares_its_images():
    values = {"prompt": "<image>Which colour?", "chosen": "Red.", "rejected": "Blue.", "images": [png_bytes(picture())]}
    parsed = parse("preference", values)
    prompt = {"role": "user", "content": [IMAGE, text("Which colour?")]}
    assert parsed.sequences == [Chat([prompt, {"role": "assistant", "content": "Red."}], first_trained=1),
                                Chat([prompt, {"role": "assistant", "content": "Blue."}], first_trained=1)]
    assert len(parsed.images) == 1  # once for the pair


def test_a_kto_row_carries_its_images():
    values = {"messages": [{"role": "user", "content": "Colour?"}], "completion": "Red.", "label": True,
              "images": [png_bytes(picture())]}
    parsed = parse("kto", values)
    assert parsed.sequences[0].messages[0] == {"role": "user", "content": [IMAGE, text("Colour?")]}
    assert parsed.fields == {"label": 1.0} and len(parsed.images) == 1


def test_the_pixel_bound_applies_when_parsing():
    values = {"prompt": "Describe.", "response": "dots", "images": [png_bytes(picture(400, 300))]}
    assert parse("prompt_response", values, max_image_pixels=10_000).images[0].size == (115, 86)


# ---------------------------------------------------------------------------------------------
# End to end through the reader


def test_relative_image_paths_are_relative_to_the_dataset_file(tmp_path, monkeypatch):
    folder = tmp_path / "set"
    (folder / "pics").mkdir(parents=True)
    (folder / "pics" / "a.png").write_bytes(png_bytes(picture()))
    rows = [{"prompt": "<image>Describe.", "response": "Dots.", "images": ["pics/a.png"]},
            {"prompt": "<image>Again.", "response": "Dots.", "images": ["pics/missing.png"]}]
    (folder / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # not the dataset's folder: relative paths must not use it

    raw = read_dataset(DatasetSpec(path="../set/data.jsonl"))
    assert raw.root is not None and raw.root.resolve() == folder
    first = parse_row("prompt_response", raw.rows[0].values, location=raw.location, row=1, chat_template=True,
                      image_root=raw.root)
    assert list(first.images[0].getdata()) == list(picture().getdata())
    with pytest.raises(DataError) as caught:
        parse_row("prompt_response", raw.rows[1].values, location=raw.location, row=2, chat_template=True,
                  image_root=raw.root)
    assert str(caught.value).startswith(f"{raw.location}, row 2, field 'images[0]': file not found: ")
    assert caught.value.problem.endswith(str(Path("set") / "pics" / "missing.png"))


def test_a_datasets_image_column_in_parquet(tmp_path):
    from datasets import Dataset

    path = tmp_path / "vlm.parquet"
    Dataset.from_dict({"prompt": ["Describe."], "response": ["Dots."], "images": [[picture()]]}).to_parquet(path)
    raw = read_dataset(DatasetSpec(path=str(path)))
    parsed = parse_row("prompt_response", raw.rows[0].values, location=raw.location, row=1, chat_template=True,
                       image_root=raw.root)
    assert list(parsed.images[0].getdata()) == list(picture().getdata())
    assert parsed.sequences[0].messages[0]["content"] == [IMAGE, text("Describe.")]


# ---------------------------------------------------------------------------------------------
# Image files that never end, or wait forever

def test_an_image_path_to_a_fifo_is_refused_at_once(tmp_path):
    fifo = make_fifo(tmp_path / "picture.png")
    error = raised_within(20, lambda: decode_image("picture.png", root=tmp_path, max_pixels=100), [fifo])
    assert isinstance(error, ImageError) and str(error) == f"{fifo}: is a FIFO (named pipe), not a regular file"


def test_an_image_path_to_a_device_is_refused_by_what_it_is(tmp_path):
    # In a child bounded to 2 GiB of address space: were /dev/zero read, it would end there, not in this process.
    (tmp_path / "link.png").symlink_to("/dev/zero")
    script = ("import sys\nfrom oxrl.data.images import ImageError, decode_image\nfor path in sys.argv[1:]:\n"
              "    try:\n        decode_image(path, root=None, max_pixels=100)\n"
              "    except ImageError as error:\n        print(error)\n")
    gib2 = 2 << 30
    done = subprocess.run([sys.executable, "-c", script, "/dev/zero", "/dev/urandom", str(tmp_path / "link.png")],
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (gib2, gib2)))
    assert done.stdout.splitlines() == [
        "/dev/zero: is a character device, not a regular file", "/dev/urandom: is a character device, not a regular file",
        f"{tmp_path / 'link.png'}: is a character device (a symlink to /dev/zero), not a regular file"], done.stderr


def test_an_image_file_larger_than_the_cap_is_refused_by_its_size(tmp_path):
    from oxrl.data.images import MAX_IMAGE_FILE_BYTES

    huge = tmp_path / "huge.png"
    huge.write_bytes(png_bytes(picture()))
    os.truncate(huge, MAX_IMAGE_FILE_BYTES + 1)  # sparse: no disk, and no bytes read before the refusal
    values = {"prompt": "<image>What is it?", "response": "dots", "images": [str(huge)]}
    with pytest.raises(DataError, match=rf"rows.jsonl, row 3, field 'images\[0\]': {huge}: 67,108,865 bytes, more than "
                                        r"the 67,108,864 an image file may have$"):
        parse("prompt_response", values)
    os.truncate(huge, MAX_IMAGE_FILE_BYTES)  # at the cap: read, and the zeros after the PNG's end are ignored
    assert decode_image(str(huge), root=None, max_pixels=100).size == (6, 4)
