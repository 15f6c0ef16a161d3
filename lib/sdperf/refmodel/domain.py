"""A captioned image domain the study generates itself: one or two shapes on a plain background.

Every scene is a pure function of (seed, index), so the domain is unlimited and its ground truth exact. Captions say
all of it, so a model must read every word and a speed-up's failures are countable (a wrong colour, a missing or
extra object, a wrong quadrant). Images are drawn at SUPERSAMPLE x the resolution and box-filtered down.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (214, 39, 40), "green": (44, 160, 44), "blue": (31, 84, 214), "yellow": (232, 200, 28)}
SIZES = ("small", "large")
POSITIONS = ("top left", "top right", "bottom left", "bottom right")  # quadrant q: row q // 2, column q % 2
BACKGROUNDS = {"light": (236, 236, 230), "dark": (34, 34, 40)}
TWO_OBJECTS = 0.6  # share of scenes with two objects
RADIUS = {"small": 0.22, "large": 0.38}  # of a quadrant's side
JITTER = 0.12  # the centre moves up to this share of a quadrant's side from the quadrant's centre
SUPERSAMPLE = 4
NONE = 0  # shape label of an empty quadrant; shapes are 1..3
IGNORE = -1  # colour/size label of an empty quadrant


@dataclass(frozen=True)
class Thing:
    shape: str
    colour: str
    size: str
    position: int  # quadrant index into POSITIONS
    dx: float = 0.0  # jitter, as a share of the quadrant's side
    dy: float = 0.0

    def words(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} at the {POSITIONS[self.position]}"


@dataclass(frozen=True)
class Scene:
    things: tuple[Thing, ...]  # ordered by quadrant
    background: str

    @property
    def caption(self) -> str:
        return " and ".join(t.words() for t in self.things) + f" on a {self.background} background"


def scene(seed: int, index: int) -> Scene:
    """Scene `index` of the domain drawn from `seed`; independent of every other index."""
    rng = np.random.default_rng([int(seed), int(index)])
    n = 2 if rng.random() < TWO_OBJECTS else 1
    quadrants = sorted(int(q) for q in rng.choice(len(POSITIONS), size=n, replace=False))
    things = tuple(Thing(shape=SHAPES[rng.integers(len(SHAPES))], colour=tuple(COLOURS)[rng.integers(len(COLOURS))],
                         size=SIZES[rng.integers(len(SIZES))], position=q,
                         dx=float(rng.uniform(-JITTER, JITTER)), dy=float(rng.uniform(-JITTER, JITTER)))
                   for q in quadrants)
    return Scene(things, tuple(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))])


def scenes(seed: int, n: int, start: int = 0) -> list[Scene]:
    return [scene(seed, i) for i in range(start, start + n)]


def render(s: Scene, resolution: int) -> np.ndarray:
    """uint8 HWC RGB image of the scene at `resolution` x `resolution`."""
    big = resolution * SUPERSAMPLE
    img = Image.new("RGB", (big, big), BACKGROUNDS[s.background])
    draw = ImageDraw.Draw(img)
    side = big / 2
    for t in s.things:
        row, col = divmod(t.position, 2)
        cx, cy = (col + 0.5 + t.dx) * side, (row + 0.5 + t.dy) * side
        r = RADIUS[t.size] * side
        fill = COLOURS[t.colour]
        if t.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        elif t.shape == "square":
            h = 0.85 * r  # equal area would be 0.89 r; a little smaller keeps corners inside the quadrant
            draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
        else:
            draw.polygon([(cx, cy - r), (cx - r, cy + 0.8 * r), (cx + r, cy + 0.8 * r)], fill=fill)
    return np.asarray(img.resize((resolution, resolution), Image.Resampling.BOX))


def render_many(items: list[Scene], resolution: int) -> np.ndarray:
    """uint8 NHWC."""
    return np.stack([render(s, resolution) for s in items])


def labels(s: Scene) -> np.ndarray:
    """Per quadrant (shape: NONE or 1 + SHAPES index, colour, size: IGNORE where empty), then the background."""
    out = [NONE, IGNORE, IGNORE] * len(POSITIONS)
    for t in s.things:
        out[3 * t.position: 3 * t.position + 3] = [1 + SHAPES.index(t.shape), tuple(COLOURS).index(t.colour),
                                                   SIZES.index(t.size)]
    return np.array(out + [tuple(BACKGROUNDS).index(s.background)], dtype=np.int64)


def labels_many(items: list[Scene]) -> np.ndarray:
    return np.stack([labels(s) for s in items])


def attributes(s: Scene) -> list[str]:
    """The caption's checkable claims, in the order `evaluator.adherence_checks` scores them."""
    claims = []
    for t in s.things:
        where = POSITIONS[t.position]
        claims += [f"an object at the {where}", f"{t.shape} at the {where}", f"{t.colour} at the {where}",
                   f"{t.size} at the {where}"]
    return claims + [f"{len(s.things)} object(s) in all", f"{s.background} background"]


def vocabulary() -> list[str]:
    """Every word a caption can use."""
    words = {"a", "at", "the", "and", "on", "background", "top", "bottom", "left", "right"}
    words |= set(SHAPES) | set(COLOURS) | set(SIZES) | set(BACKGROUNDS)
    return sorted(words)


def distinct_captions() -> int:
    """How many different captions the domain has (positions unordered, jitter not in words)."""
    per_thing, n_pos = len(SHAPES) * len(COLOURS) * len(SIZES), len(POSITIONS)
    pairs = n_pos * (n_pos - 1) // 2
    return (n_pos * per_thing + pairs * per_thing ** 2) * len(BACKGROUNDS)
