"""The ``packtool`` command group and its plumbing: every :class:`PacktoolError` becomes
``Error: <message>`` and exit code 1; an OS error names the output, never a temporary;
Ctrl-C and SIGTERM exit 130/143 after the library has removed its temporary files."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from .. import __version__
from ..errors import PacktoolError
from ..formats._manifest import manifest_text


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="packtool")
@click.option("--storage-options", metavar="JSON", default=None,
              help="For s3://, gs://, hf:// ... paths: the fsspec filesystem's options as a JSON "
                   "object, e.g. '{\"endpoint_url\": \"http://127.0.0.1:9000\"}' "
                   "(credentials come from the usual places; docs/STORAGE.md).")
def cli(storage_options):
    """Turn raw text corpora into packed, padding-free LLM training data.

    \b
    Example:
        packtool tokenize data/ --tokenizer model/ --eos '<|eos|>' --out out/corpus
        packtool pack out/corpus --seq-len 4096 --algo bfd --out out/packed
        packtool verify out/packed --source out/corpus
        packtool stats out/corpus --algos all
    """
    if storage_options:
        from ..storage import set_default_options

        run(set_default_options, storage_options)


def run(fn, *args, **kwargs):
    """Call the library; its errors become clean messages and exit codes: a store's
    (no credentials, unreachable, timed out: :func:`packtool.storage.store_error`, naming the
    command's URLs), the disk's, memory."""
    try:
        return fn(*args, **kwargs)
    except PacktoolError as e:
        raise click.ClickException(str(e)) from None
    except Exception as e:
        from ..storage import store_error

        known = store_error(e, _urls(args, kwargs))
        if known is not None:
            raise click.ClickException(str(known)) from None
        if isinstance(e, OSError):  # disk full, permissions, read-only file systems...
            raise _os_error(e) from None
        if isinstance(e, MemoryError):
            raise click.ClickException("out of memory; a smaller input, --group-docs (pack) "
                                       "or a smaller --seq-len/--work-limit needs less") from None
        raise


def _urls(args, kwargs) -> list[str]:
    """The URLs among a library call's arguments (a path, or a list of them)."""
    from ..storage import is_url

    values = [*args, *kwargs.values()]
    flat = [v for x in values for v in (x if isinstance(x, list | tuple) else [x])]
    return [str(v) for v in flat if isinstance(v, str | Path) and is_url(v)]


def _os_error(e: OSError) -> click.ClickException:
    import errno

    from ..storage.atomic import final_name

    where = f" {final_name(e.filename)}" if e.filename else ""  # the output, not a temp
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        import shutil

        free = shutil.disk_usage(Path(e.filename).parent).free if e.filename else None
        return click.ClickException(
            f"no space left on device writing{where or ' the output'}"
            + (f" ({free:,} bytes free there)" if free is not None else "")
            + "; free space or choose another --out")
    return click.ClickException(f"cannot read or write{where}: {e.strerror or e}")


def emit(result, as_json: bool, quiet: bool) -> None:
    """Every command's result on stdout, where a pipe reads it (as sqlite-utils prints its
    results): JSON with --json, else the summary; the result's warnings, like the progress
    bars and errors, on stderr, even with --quiet or --json."""
    warnings = list(getattr(result, "warnings", None) or [])
    if as_json:
        # (json.dumps with indent=1 took 0.19 s of CPU for a run of 2,000 inputs)
        click.echo(manifest_text(result.to_json()), nl=False)
    elif not quiet:
        click.echo(result.summary(warnings=False) if warnings else result.summary())
    for w in warnings:
        click.echo(f"warning: {w}", err=True)


def _interrupted(signal) -> int:
    """Say how a run stopped by Ctrl-C or SIGTERM left its output; the exit code."""
    from .. import _signals

    term = bool(_signals.received) and _signals.received[-1] == signal.SIGTERM
    what = "Terminated" if term else "Interrupted"
    complete = _signals.after_commit()
    kept = None if complete else _signals.kept()
    if complete:  # past the point of no return: say so, do not claim less
        click.echo(f"{what} after the output was complete: it is in place.", err=True)
    elif kept is not None:  # finished parts, committed one by one, but no manifest
        manifest, left, bucket = kept
        rest = ("objects of a job not finished may be there, unlisted: readers see nothing "
                "before the manifest, and the re-run replaces them" if bucket
                else "nothing half-written is left")
        click.echo(f"{what} before the output was complete ({manifest} was not written): "
                   f"{left} stay, and the same command run again resumes from them; {rest}.",
                   err=True)
    else:
        click.echo(f"{what}: no output was written.", err=True)
    return 143 if term else 130


def main() -> None:
    """Run the CLI, then leave with ``os._exit`` once the library has removed its temporaries:
    a worker thread still inside a tokenizer call or a runaway template cannot hold the exit
    (the interpreter would join it), and a signal during interpreter shutdown cannot turn a
    finished run into a death by signal."""
    import os
    import signal

    from .. import _signals

    _signals.install()  # before any heavy import: a signal during one is never lost
    code = 0
    try:
        cli.main(prog_name="packtool", standalone_mode=False)
        _signals.hold()
        _signals.check()
    except (click.exceptions.Abort, KeyboardInterrupt):
        _signals.hold()
        code = _interrupted(signal)
    except click.ClickException as e:
        _signals.hold()
        if _signals.received:  # the signal's exception, raised inside a library's callback,
            code = _interrupted(signal)  # came back as another error (a Rust panic's text)
        else:
            e.show()
            code = e.exit_code
    except click.exceptions.Exit as e:
        _signals.hold()
        code = e.exit_code
    except BaseException:  # a signal's exception that a library turned into another one
        _signals.hold()
        if not _signals.received:
            raise
        code = _interrupted(signal)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
