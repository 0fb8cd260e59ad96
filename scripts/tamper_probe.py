"""Tamper with a multi-part token corpus and a packed dataset; count what is accepted.

    python scripts/tamper_probe.py [--workdir bench-out/tamper] [--root CHECKOUT]

Unlike a random flip (scripts/flip_probe.py), each tamper is a deliberate, self-consistent
edit by someone who read docs/FORMAT.md: the totals are fixed, the checksums of every data
file changed are recomputed, and so are the manifests' own digests (``manifest_sha256``,
``index_sha256``: sha256 of the JSON without the key, computed here with our own code).

Token corpus (4 parts, one per input file; another corpus ``B`` of 4 other files):

- ``zero-docs``: part 1 keeps its tokens but loses its documents (boundaries emptied);
- ``reorder``: parts 1 and 2 swapped; ``duplicate``: part 2 replaced by a copy of part 1;
  ``drop``: part 3 removed; ``swap``: part 2 replaced by B's part 2 (files and entry);
- ``counts``: a part's ``n_empty`` and the total edited; ``vocab``: ``vocab_size`` lowered
  below the largest id; ``tokenizer``: the tokenizer's sha256 replaced.

each at two levels: ``edit`` (the above, names and positions as the edit leaves them) and
``forge`` (also every entry renumbered to its new position and named after it, the plan's
digest recomputed from the parts' digests, and the digests the corpus manifest keeps of the
parts' manifests, ``part_manifests_sha256``), and with the parts' hidden manifests
(``.NAME.part.json``) ``left`` as the run wrote them, ``edited`` to agree with the new
manifest, or ``removed`` (a version-3 corpus requires them). Packed dataset (index layout,
and tokens layout where the checkout writes it): ``seq_len``, ``n_tokens`` and a shard's
``n_packs`` edited; two values of a shard's array swapped (its crc32 and size recomputed);
the source pointed at corpus B (its manifest sha256, counts recorded).

Each tampered copy is judged three ways, each in a fresh process: ``load`` (open it and read
every document or pack), ``verify`` (``packtool verify``), and for a packed dataset ``verify
--source`` with the untouched corpus. ``accepted`` means the strongest check passed it. A
``forge`` with the hidden manifests edited is a different corpus consistent in every byte
(the names, positions and digests anyone can compute): it is reported apart, as what no check
without a secret key or the original inputs can refuse. (With them removed it is not: a
version-3 corpus requires them.)

Runs the packtool of ``--root`` (default: this checkout), e.g. ``--root /tmp/before``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
N_PARTS = 4


# --------------------------------------------------------------------------- helpers
def digest(body: dict, key: str) -> str:
    rest = {k: v for k, v in body.items() if k != key}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def crc32(path: Path) -> str:
    return f"{zlib.crc32(path.read_bytes()):08x}"


def packtool(root: Path, *args, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "packtool", *map(str, args)], cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                       text=True)
    if check and r.returncode:
        raise SystemExit(f"setup failed: packtool {' '.join(map(str, args))}\n{r.stderr}")
    return r


def build(root: Path, work: Path) -> dict:
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import make_documents

    tok = root / "fixtures" / "tokenizer" / "tokenizer.json"
    shutil.rmtree(work, ignore_errors=True)
    for name, seed in (("a", 1), ("b", 2)):
        (work / f"in-{name}").mkdir(parents=True)
        docs = make_documents(N_PARTS * 60, seed=seed, median_words=40, max_words=300)
        for k in range(N_PARTS):
            with open(work / f"in-{name}" / f"f{k}.jsonl", "w") as f:
                for d in docs[k * 60:(k + 1) * 60]:
                    f.write(json.dumps({"text": d}) + "\n")
        (work / name).mkdir()
        packtool(root, "tokenize", work / f"in-{name}", "-t", tok, "-o", work / name / "c",
                 "--part-bytes", "1", "-q")
    layouts = {}
    help_text = packtool(root, "pack", "--help").stdout
    for layout in (("index", "tokens") if "--layout" in help_text else ("default",)):
        out = work / "a" / f"p-{layout}"
        extra = ["--layout", layout] if layout != "default" else []
        packtool(root, "pack", work / "a" / "c", "-L", "128", "--shard-size", "4000", "-o",
                 out, "-q", *extra)
        layouts[layout] = out
    return {"a": work / "a", "b": work / "b", "packed": layouts}


# ------------------------------------------------------------------ token corpus edits
class Corpus:
    """A copy of corpus ``c`` in ``folder`` as plain JSON and files, edited in place."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.meta = json.loads((folder / "c.json").read_text())
        self.parts = self.meta["parts"]

    def files(self, name: str) -> list[Path]:
        return [self.folder / f"{name}{s}" for s in (".bin", ".boundaries", ".mask")
                if (self.folder / f"{name}{s}").exists()]

    def hidden(self, name: str) -> Path:
        return self.folder / f".{name}.part.json"

    def rename(self, old: str, new: str, suffix: str = "") -> None:
        for f in self.files(old):
            f.rename(self.folder / f"{new}{suffix}{f.suffix}")
        if self.hidden(old).exists():
            self.hidden(old).rename(self.folder / f".{new}{suffix}.part.json")

    def rehash(self, entry: dict) -> None:
        for key, want in entry["checksums"].items():
            path = self.folder / f"{entry['name']}.{key}"
            want["sha256"], want["bytes"] = sha256(path), path.stat().st_size

    def save(self, forge: bool, hidden: str, original: dict) -> None:
        m = self.meta
        if forge:  # every entry named after its position, the plan digest recomputed
            prefix = (m.get("plan") or {}).get("prefix", "c")
            for k, q in enumerate(self.parts):
                want = f"{prefix}.part-{k:05d}" if len(self.parts) > 1 else prefix
                if q["name"] != want:
                    self.rename(q["name"], want, ".forging")
                    q["_from"], q["name"] = q["name"], want
            for f in list(self.folder.iterdir()):
                if ".forging" in f.name:
                    f.rename(self.folder / f.name.replace(".forging", ""))
            for k, q in enumerate(self.parts):
                q.pop("_from", None)
                if "index" in q:
                    q["index"] = k
            if "plan" in m:
                m["plan"]["n_parts"] = len(self.parts)
                if all("digest" in q for q in self.parts):
                    m["plan"]["digest"] = hashlib.sha256(json.dumps(
                        [q["digest"] for q in self.parts], sort_keys=True).encode()).hexdigest()
        for key in ("n_docs", "n_tokens", "n_empty", "n_trained_tokens"):
            if key in m:
                m[key] = sum(q.get(key, 0) for q in self.parts)
        if "inputs" in m:
            m["inputs"] = [i for q in self.parts for i in q.get("inputs", [])]
        if "plan" in m:
            m["plan"]["n_parts"] = len(self.parts)
        if "manifest_sha256" in m:
            m["manifest_sha256"] = digest(m, "manifest_sha256")
        (self.folder / "c.json").write_text(json.dumps(m, indent=1))
        names = {q["name"] for q in self.parts}
        for f in self.folder.glob(".*.part.json"):
            name = f.name[1:-len(".part.json")]
            if hidden == "removed" or name not in names:
                f.unlink()
        if hidden == "edited":
            for k, q in enumerate(self.parts):
                path = self.hidden(q["name"])
                body = json.loads(path.read_text()) if path.exists() else dict(original)
                body.update({"part": q})
                if "index" in body:
                    body["index"] = q.get("index", k)
                if "digest" in body and "digest" in q:
                    body["digest"] = q["digest"]
                if "plan_digest" in body and "plan" in m:
                    body["plan_digest"] = m["plan"]["digest"]
                if "meta" in body:
                    for key in ("vocab_size", "tokenizer", "dtype"):
                        if key in m:
                            body["meta"][key] = m[key]
                path.write_text(json.dumps(body, indent=1))
        if forge and "part_manifests_sha256" in m:  # the corpus's record of those manifests
            m["part_manifests_sha256"] = [
                hashlib.sha256(json.dumps(json.loads(self.hidden(q["name"]).read_text()),
                                          sort_keys=True).encode()).hexdigest()
                if self.hidden(q["name"]).exists() else "0" * 64 for q in self.parts]
            m["manifest_sha256"] = digest(m, "manifest_sha256")
            (self.folder / "c.json").write_text(json.dumps(m, indent=1))


def t_zero_docs(c: Corpus, b: Corpus) -> None:
    q = c.parts[1]
    (c.folder / f"{q['name']}.boundaries").write_bytes(b"")
    q["n_docs"], q["n_empty"] = 0, 0
    for i in q.get("inputs", []):
        i["n_docs"] = 0
    c.rehash(q)


def t_reorder(c: Corpus, b: Corpus) -> None:
    c.parts[1], c.parts[2] = c.parts[2], c.parts[1]


def t_duplicate(c: Corpus, b: Corpus) -> None:
    src, dst = c.parts[1], c.parts[2]
    for f in c.files(dst["name"]):
        f.unlink()
    for f in c.files(src["name"]):
        shutil.copy(f, c.folder / f"{dst['name']}{f.suffix}")
    c.parts[2] = {**json.loads(json.dumps(src)), "name": dst["name"]}
    if "index" in dst:
        c.parts[2]["index"] = dst["index"]


def t_drop(c: Corpus, b: Corpus) -> None:
    q = c.parts.pop(3)
    for f in c.files(q["name"]):
        f.unlink()


def t_swap(c: Corpus, b: Corpus) -> None:
    theirs = b.parts[2]
    for f in b.files(theirs["name"]):
        shutil.copy(f, c.folder / f.name)
    c.parts[2] = json.loads(json.dumps(theirs))


def t_counts(c: Corpus, b: Corpus) -> None:
    c.parts[1]["n_empty"] = c.parts[1].get("n_empty", 0) + 3


def t_vocab(c: Corpus, b: Corpus) -> None:
    c.meta["vocab_size"] = 100


def t_tokenizer(c: Corpus, b: Corpus) -> None:
    c.meta["tokenizer"]["sha256"] = "0" * 64


TOKEN_TAMPERS = {"zero-docs": t_zero_docs, "reorder": t_reorder, "duplicate": t_duplicate,
                 "drop": t_drop, "swap": t_swap, "counts": t_counts, "vocab": t_vocab,
                 "tokenizer": t_tokenizer}


# ------------------------------------------------------------------ packed index edits
def _save_index(d: Path, idx: dict) -> None:
    if "index_sha256" in idx:
        idx["index_sha256"] = digest(idx, "index_sha256")
    (d / "index.json").write_text(json.dumps(idx, indent=1))


def p_seq_len(d: Path, ctx: dict) -> None:
    idx = json.loads((d / "index.json").read_text())
    idx["seq_len"] *= 2
    _save_index(d, idx)


def p_n_tokens(d: Path, ctx: dict) -> None:
    idx = json.loads((d / "index.json").read_text())
    idx["n_tokens"] -= 1
    _save_index(d, idx)


def p_n_packs(d: Path, ctx: dict) -> None:
    idx = json.loads((d / "index.json").read_text())
    idx["shards"][0]["n_packs"] -= 1
    idx["n_packs"] -= 1
    _save_index(d, idx)


def p_array(d: Path, ctx: dict) -> None:
    """Two different values of one of shard 0's arrays swapped (segment documents in the
    index layout, tokens in the tokens layout), its crc32 and size recomputed."""
    idx = json.loads((d / "index.json").read_text())
    files = idx["shards"][0]["files"]
    role = next(r for r in ("seg_doc", "tokens", "doc_ids", "source_docs") if r in files)
    path = d / files[role]["name"]
    arr = np.load(path)
    i = 0
    j = next(k for k in range(1, len(arr)) if arr[k] != arr[i])
    arr[i], arr[j] = arr[j], arr[i]
    np.save(path, arr)
    files[role]["crc32"], files[role]["bytes"] = crc32(path), path.stat().st_size
    _save_index(d, idx)


def p_source(d: Path, ctx: dict) -> None:
    """The dataset's source pointed at another corpus (its manifest's sha256, counts)."""
    idx = json.loads((d / "index.json").read_text())
    other = ctx["b"] / "c"
    meta = json.loads(Path(f"{other}.json").read_text())
    for s in idx["sources"]:
        s["prefix"] = str(other)
        if "path" in s:
            s["path"] = os.path.relpath(other, d)
        s["manifest_sha256"] = sha256(Path(f"{other}.json"))
        for key in ("n_docs", "n_tokens"):
            if key in s:
                s[key] = meta[key]
    _save_index(d, idx)


PACKED_TAMPERS = {"seq_len": p_seq_len, "n_tokens": p_n_tokens, "n_packs": p_n_packs,
                  "array": p_array, "source": p_source}


# ----------------------------------------------------------------------------- judging
_READ = {
    "tokens": "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import packtool; "
              "c = packtool.open_tokens(sys.argv[2]); [np.asarray(c[i]) for i in range(len(c))]",
    "packed": "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import packtool; "
              "ds = packtool.open_packed(sys.argv[2]); [ds[i] for i in range(len(ds))]",
}


def judge(root: Path, kind: str, path: Path, source: Path | None) -> dict:
    """{check: True if it passed the tampered copy}: the checks run side by side, each in a
    process of its own (none writes; they only read the tampered copy)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmds = {"load": [sys.executable, "-c", _READ[kind], str(root), str(path)],
            "verify": [sys.executable, "-m", "packtool", "verify", str(path)]}
    if source is not None:
        cmds["verify --source"] = [*cmds["verify"], "--source", str(source)]
    procs = {k: subprocess.Popen(c, cwd=root, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for k, c in cmds.items()}
    return {k: p.wait() == 0 for k, p in procs.items()}


def campaign(root: Path, work: Path, log=print) -> list[dict]:
    ctx = build(root, work)
    rows = []
    for name, tamper in TOKEN_TAMPERS.items():
        for level in ("edit", "forge"):
            for hidden in ("left", "edited", "removed"):
                d = work / "t" / f"{name}-{level}-{hidden}"
                shutil.copytree(ctx["a"], d, ignore=shutil.ignore_patterns("p-*"))
                c, b = Corpus(d), Corpus(ctx["b"])
                original = json.loads(c.hidden(c.parts[0]["name"]).read_text())
                tamper(c, b)
                c.save(level == "forge", hidden, original)
                res = judge(root, "tokens", d / "c", None)
                forgery = level == "forge" and hidden == "edited"
                rows.append({"target": "token corpus", "tamper": name, "level": level,
                             "hidden": hidden, "forgery": forgery, **res,
                             "accepted": res["verify"]})
                log(f"  tokens {name:10} {level:5} hidden {hidden:8} "
                    f"{'ACCEPTED' if res['verify'] else 'refused'} (load: "
                    f"{'passed' if res['load'] else 'refused'})")
    for layout, packed in ctx["packed"].items():
        for name, tamper in PACKED_TAMPERS.items():
            d = work / "t" / f"packed-{layout}-{name}"
            shutil.copytree(packed, d)
            tamper(d, ctx)
            res = judge(root, "packed", d, ctx["a"] / "c")
            rows.append({"target": f"packed ({layout})", "tamper": name, "level": "edit",
                         "hidden": "-", "forgery": False, **res,
                         "accepted": res["verify --source"]})
            log(f"  packed {layout:7} {name:10} "
                f"{'ACCEPTED' if res['verify --source'] else 'refused'} "
                f"(load {'passed' if res['load'] else 'refused'}, verify "
                f"{'passed' if res['verify'] else 'refused'})")
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'target':18} {'tampers':>8} {'accepted':>9} {'passed load':>12} "
             f"{'passed verify':>14}"]
    groups: dict = {}
    for r in rows:
        key = r["target"] + (" (forgery)" if r["forgery"] else "")
        groups.setdefault(key, []).append(r)
    for key, rs in groups.items():
        lines.append(f"{key:18} {len(rs):>8} {sum(r['accepted'] for r in rs):>9} "
                     f"{sum(r['load'] for r in rs):>12} {sum(r['verify'] for r in rs):>14}")
    honest = [r for r in rows if not r["forgery"]]
    lines.append(f"{'total (no forgery)':18} {len(honest):>8} "
                 f"{sum(r['accepted'] for r in honest):>9}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out" / "tamper")
    ap.add_argument("--root", type=Path, default=ROOT, help="the packtool checkout to probe")
    a = ap.parse_args()
    rows = campaign(a.root.resolve(), a.workdir.resolve())
    print(table(rows))
    sys.exit(1 if any(r["accepted"] for r in rows if not r["forgery"]) else 0)


if __name__ == "__main__":
    main()
