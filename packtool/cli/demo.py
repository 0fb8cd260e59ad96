"""``packtool demo``: the main job end to end on the bundled corpus (fixtures/)."""

from __future__ import annotations

from pathlib import Path

from ..errors import PacktoolError


def find_fixtures(fixtures: str | Path | None) -> Path:
    candidates = [Path(fixtures)] if fixtures else [
        Path.cwd() / "fixtures", Path(__file__).resolve().parent.parent / "fixtures"]
    for c in candidates:
        if (c / "tokenizer" / "tokenizer.json").is_file() and (c / "corpus").is_dir():
            return c
    raise PacktoolError(
        f"no fixtures found at {', '.join(map(str, candidates))}; run from the packtool "
        "repository root or pass --fixtures DIR (holding tokenizer/ and corpus/)"
    )


def run_demo(fixtures, out, seq_len: int = 512, algo: str = "bfd", echo=print) -> None:
    from ..pack import pack_corpus
    from ..tokenize import TokenizeOptions, tokenize_files
    from ..verify import verify_packed

    fx = find_fixtures(fixtures)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "corpus"
    echo(f"$ packtool tokenize {fx / 'corpus'} --tokenizer {fx / 'tokenizer'} --eos '<|eos|>' "
         f"--out {prefix}")
    res = tokenize_files([str(fx / "corpus")], fx / "tokenizer", prefix,
                         TokenizeOptions(eos="<|eos|>", overwrite=True))
    echo(res.summary())
    packed = out / "packed"
    echo(f"$ packtool pack {prefix} --seq-len {seq_len} --algo {algo} --out {packed}")
    echo(pack_corpus([prefix], packed, seq_len, algo, overwrite=True).summary())
    echo(f"$ packtool verify {packed} --source {prefix}")
    echo(verify_packed(packed, [prefix]).summary())
    from .. import open_tokens
    from ..packers import PACKERS
    from ..stats import corpus_report, packed_report, render_corpus, render_packed

    fast = [a for a in PACKERS if a != "nnlshp"]  # nnlshp's NNLS takes ~30 s: not for a demo
    echo(f"$ packtool stats {prefix} --seq-len {seq_len} --seq-len {2 * seq_len} "
         f"--algos {','.join(fast)}")
    rep = corpus_report(open_tokens(prefix).lengths, [seq_len, 2 * seq_len], algos=fast,
                        source=str(prefix))
    echo(render_corpus(rep))
    echo(f"$ packtool stats {packed}")
    echo(render_packed(packed_report(packed)))
