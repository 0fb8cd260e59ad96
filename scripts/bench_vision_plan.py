"""Planning image records (issue 42, "Done when"): ``tokenize --vision`` over N image records
(one generated PNG or JPEG file each, of varied sizes) on ONE core (the process pinned with
``sched_setaffinity``), measured two ways, and the vision token counts checked against the
model's own image processor:

- ``vision counting``: what ``--vision`` adds per record, alone: the record's image found,
  its bytes read and hashed (``--image-check sha256``, the default) or its header alone
  read (``--image-check header``), its size read from the header, its grid and token count
  by the rule (``packtool.vision.images.VisionReader`` on the parsed records);
- ``whole tokenize``: ``tokenize_files`` with ``--workers 1``, JSON to the committed corpus
  (tokenizing, image tokens expanded, spans, references, 3-D positions, hashes, commit):
  per wall second, and per second of the process's CPU time (the core's, where other
  processes share it: a wall figure then counts their time too);
- ``reads no pixels``: the header counter (``packtool.vision.COUNTER``): header bytes read
  per image and Pillow fallbacks (decodes); with sha256 the hash reads every file byte too
  (``mean_file_bytes``), with header nothing else;
- ``equal to the processor``: for ``--check`` images, Pillow opens the file and
  transformers' ``Qwen2VLImageProcessorPil`` (the model's processor, pixels and all) makes
  its ``image_grid_thw`` and ``pixel_values``: grid and token count equal to the corpus's.

The images are generated once into ``--cache`` (reused by later runs). Solid colours keep
generation fast, so the files are small (about 1 KB): the sha256 of a real photo (100 KB -
1 MB) costs more, and the run prints what it would at 300 KB from the hash speed measured.

    PYTHONPATH=$PWD python scripts/bench_vision_plan.py [--records 100000] [--check 1000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"
SPECIALS = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "</s>"]


def sizes(n: int, seed: int = 0) -> np.ndarray:
    """Widths and heights log-uniform in 16..2048 pixels (aspect ratios up to 128)."""
    rng = np.random.default_rng(seed)
    return np.exp(rng.uniform(np.log(16), np.log(2048), (n, 2))).astype(int)


def generate(folder: Path, n: int) -> list[str]:
    """n image files (PNG and JPEG alternately), made once; their names."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    names = [f"img/{i // 1000:03d}/{i:06d}.{'png' if i % 2 else 'jpg'}" for i in range(n)]
    done = folder / f".done-{n}"
    if done.exists():
        return names
    t0 = time.perf_counter()
    for i, (w, h) in enumerate(sizes(n)):
        p = folder / names[i]
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (int(w), int(h)), (i % 251, 80, 160)).save(
                p, "PNG" if i % 2 else "JPEG", quality=60)
        if i % 10_000 == 0:
            print(f"  generating images: {i:,}/{n:,} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr)
    done.touch()
    return names


def write_records(folder: Path, names: list[str]) -> Path:
    path = folder / f"records-{len(names)}.jsonl"
    if not path.exists():
        with open(path, "w") as f:
            for i, name in enumerate(names):
                f.write(json.dumps({"prompt": f"<image>\nWhat is in picture {i}?",
                                    "completion": "A plain colour.", "images": [name]}) + "\n")
    return path


def tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens(SPECIALS)
    (folder / "tok").mkdir(exist_ok=True)
    tok.save(str(folder / "tok" / "tokenizer.json"))
    return folder / "tok" / "tokenizer.json"


def count_only(records: Path, rule: str, check: str) -> dict:
    """The vision part alone, on records already parsed."""
    from packtool.sources import ReadOptions
    from packtool.vision import COUNTER, RULES
    from packtool.vision.images import VisionReader

    objs = [json.loads(line) for line in records.read_text().splitlines()]
    reader = VisionReader(RULES[rule], "images", check=check)
    reader.source = str(records)
    opts = ReadOptions(prompt_field="prompt", completion_field="completion",
                       images_field="images")
    COUNTER.reset()
    t0 = time.process_time()
    n_tokens = sum(im.n_tokens for o in objs for im in reader(o, opts).images)
    cpu = time.process_time() - t0
    return {"records": len(objs), "cpu_s": cpu, "records_per_s": len(objs) / cpu,
            "vision_tokens": n_tokens, **COUNTER.snapshot()}


def whole(records: Path, tok: Path, out: Path, rule: str, check: str) -> dict:
    from packtool.tokenize import TokenizeOptions, tokenize_files
    from packtool.vision import COUNTER

    shutil.rmtree(out.parent, ignore_errors=True)  # else its finished parts are skipped
    COUNTER.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    r = tokenize_files([str(records)], tok, out, TokenizeOptions(
        prompt_field="prompt", completion_field="completion", vision=rule,
        images_field="images", eos="</s>", workers=1, overwrite=True, image_check=check))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"records": r.n_docs, "wall_s": wall, "cpu_s": cpu, "records_per_s": r.n_docs / wall,
            "records_per_cpu_s": r.n_docs / cpu, "tokens": r.n_tokens, **COUNTER.snapshot()}


def processor_check(out: Path, folder: Path, n: int, rule: str) -> dict:
    """Grids and token counts of the first n images against the processor's own."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    import packtool
    from packtool.vision import RULES

    c = packtool.open_tokens(out)
    r = RULES[rule]
    proc = Qwen2VLImageProcessorPil(patch_size=r.patch, merge_size=r.merge,
                                    min_pixels=c.vision["min_pixels"],
                                    max_pixels=c.vision["max_pixels"])
    differ = 0
    for i in range(n):
        im = c.images(i)
        with Image.open(im["refs"][0]["uri"]) as pic:
            got = proc(images=[pic.convert("RGB")], return_tensors="np")
        grid = got["image_grid_thw"][0].tolist()
        tokens = got["pixel_values"].shape[0] // r.merge**2
        differ += grid != im["grid"][0].tolist() or tokens != int(im["span"][0, 1])
    return {"checked": n, "differ": differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--check", type=int, default=1000)
    ap.add_argument("--rule", default="qwen2.5-vl", choices=["qwen2-vl", "qwen2.5-vl",
                                                              "qwen3-vl"])
    ap.add_argument("--cache", type=Path,
                    default=Path(tempfile.gettempdir()) / "packtool-bench-vision")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    names = generate(a.cache, a.records)
    records = write_records(a.cache, names)
    tok = tokenizer(a.cache)
    file_bytes = sum((a.cache / n).stat().st_size for n in names)
    blob = os.urandom(64 << 20)
    t0 = time.perf_counter()
    hashlib.sha256(blob).digest()
    sha_mb_s = 64 / 1.048576 / (time.perf_counter() - t0)
    result = {"records": a.records, "rule": a.rule, "one_core": True,
              "mean_file_bytes": file_bytes / a.records, "sha256_MB_s": sha_mb_s,
              "hash_us_at_300KB": 0.3 / sha_mb_s * 1e6}
    for check in ("sha256", "header"):
        counted = count_only(records, a.rule, check)
        run = whole(records, tok, a.cache / "out" / check, a.rule, check)
        result[check] = {"vision_counting": counted, "whole_tokenize": run,
                         "bytes_read_per_image": counted["bytes_read"] / counted["images"],
                         "decodes": counted["decodes"] + run["decodes"]}
    if a.check:
        result["processor_check"] = processor_check(a.cache / "out" / "header", a.cache,
                                          min(a.check, a.records), a.rule)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
