"""Regenerate the vision-language example data: `python examples/data/make_vlm_shapes.py`.

Two small sets whose images are drawn here with PIL into examples/data/images/ (PNG files under 2 KB each), each row
naming its images by a path relative to this folder, e.g.

    vlm_shapes_sft.jsonl (examples/vlm_sft_qwen2vl.yaml): `messages` + `images`, the image an image content part
    {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the
     shape?"}]}, {"role": "assistant", "content": "It is red."}], "images": ["images/shape_00.png"]}

    vlm_geometry_prompts.jsonl (examples/vlm_grpo_qwen2vl_geometry3k.yaml): Geometry3K's `prompt` + `images` +
    `answer`, the image placed by the `<image>` marker; the labelled lengths and angles are drawn in the image only
    {"prompt": "<image>Find the area of the rectangle. ...", "images": ["images/geometry_00.png"], "answer": "15"}
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

FOLDER = Path(__file__).parent
SFT = FOLDER / "vlm_shapes_sft.jsonl"
PROMPTS = FOLDER / "vlm_geometry_prompts.jsonl"
BACKGROUND = (255, 255, 255)
INK = (0, 0, 0)
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 30), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
INSTRUCTION = "Give your final answer, a number, within \\boxed{}."


def shape(colour: str, kind: str, box: tuple[int, int, int, int], size: int = 64) -> Image.Image:
    image = Image.new("RGB", (size, size), (200, 200, 200))
    draw = ImageDraw.Draw(image)
    {"circle": draw.ellipse, "square": draw.rectangle}[kind](box, fill=COLOURS[colour])
    return image


def sft_rows() -> tuple[list[dict], dict[str, Image.Image]]:
    """Colour and shape questions about one image, and one row comparing two images."""
    rows, images = [], {}
    kinds = ("circle", "square")
    for i in range(8):
        colour, kind = list(COLOURS)[i % 4], kinds[i // 4]
        name = f"images/shape_{i:02d}.png"
        images[name] = shape(colour, kind, (8 + 2 * i, 10 + i, 54 - i, 56 - 2 * i))
        question, answer = (("What colour is the shape?", f"It is {colour}.") if i % 2 == 0 else
                            ("Describe the shape in the picture.", f"A {colour} {kind} on a grey background."))
        rows.append({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
                                  {"role": "assistant", "content": answer}],
                     "images": [name]})
    # Two images in one prompt: each image part takes the next image of `images`, in order.
    rows.append({"messages": [{"role": "user", "content": [
                     {"type": "text", "text": "First picture:"}, {"type": "image"},
                     {"type": "text", "text": "Second picture:"}, {"type": "image"},
                     {"type": "text", "text": "Which picture shows a circle?"}]},
                 {"role": "assistant", "content": "The first picture shows a circle; the second shows a square."}],
                 "images": ["images/shape_00.png", "images/shape_05.png"]})
    return rows, images


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (96, 96), BACKGROUND)
    return image, ImageDraw.Draw(image)


def rectangle(width: int, height: int) -> Image.Image:
    image, draw = _canvas()
    draw.rectangle((14, 20, 82, 70), outline=INK, width=2)
    draw.text((44, 74), str(width), fill=INK)
    draw.text((86, 40), str(height), fill=INK)
    return image


def right_triangle(base: int, height: int) -> Image.Image:
    image, draw = _canvas()
    draw.polygon([(14, 80), (80, 80), (14, 14)], outline=INK, width=2)
    draw.rectangle((14, 72, 22, 80), outline=INK)  # the right angle
    draw.text((44, 83), str(base), fill=INK)
    draw.text((2, 44), str(height), fill=INK)
    return image


def triangle_angles(first: int, second: int) -> Image.Image:
    image, draw = _canvas()
    draw.polygon([(10, 80), (86, 80), (36, 16)], outline=INK, width=2)
    draw.text((24, 66), str(first), fill=INK)
    draw.text((58, 66), str(second), fill=INK)
    draw.text((34, 26), "x", fill=INK)
    return image


def circle(radius: int) -> Image.Image:
    image, draw = _canvas()
    draw.ellipse((14, 14, 82, 82), outline=INK, width=2)
    draw.line((48, 48, 82, 48), fill=INK, width=1)
    draw.text((60, 36), str(radius), fill=INK)
    return image


def geometry_rows() -> tuple[list[dict], dict[str, Image.Image]]:
    """Geometry3K-style questions whose numbers are in the image only; the gold answer is a number."""
    problems = [
        (rectangle(5, 3), "Find the area of the rectangle.", 15),
        (rectangle(7, 4), "Find the perimeter of the rectangle.", 22),
        (right_triangle(6, 8), "Find the length of the hypotenuse.", 10),
        (right_triangle(4, 5), "Find the area of the triangle.", 10),
        (triangle_angles(60, 70), "Find x, the third angle of the triangle, in degrees.", 50),
        (circle(6), "Find the diameter of the circle.", 12),
        (rectangle(9, 2), "Find the area of the rectangle.", 18),
        (right_triangle(5, 12), "Find the length of the hypotenuse.", 13),
        (triangle_angles(45, 85), "Find x, the third angle of the triangle, in degrees.", 50),
        (circle(4), "Find the diameter of the circle.", 8),
        (rectangle(6, 6), "Find the perimeter of the rectangle.", 24),
        (triangle_angles(30, 90), "Find x, the third angle of the triangle, in degrees.", 60),
    ]
    rows, images = [], {}
    for i, (image, question, answer) in enumerate(problems):
        name = f"images/geometry_{i:02d}.png"
        images[name] = image
        rows.append({"prompt": f"<image>{question} {INSTRUCTION}", "images": [name], "answer": str(answer)})
    return rows, images


def files() -> dict[Path, list[dict]]:
    return {SFT: sft_rows()[0], PROMPTS: geometry_rows()[0]}


def main() -> None:
    for rows, images in (sft_rows(), geometry_rows()):
        for name, image in images.items():
            (FOLDER / name).parent.mkdir(parents=True, exist_ok=True)
            image.save(FOLDER / name, optimize=True)
    for path, rows in files().items():
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
