"""A template is code, and rendering is bounded. Unbounded, ``{{ 'x' * 2000000000 }}`` asked
for 2 GB while compiling (Jinja folds constants) and a nested ``range(100000)`` loop grew to
24 GB. Each render stops with a :class:`RenderLimit` beyond ``max_render_chars`` (default
33,554,432 characters: 128 MiB as UCS-4, about 8M tokens, far beyond any context) or
``render_timeout`` seconds (default 10; a real template renders a conversation in well
under a millisecond):

- ``*``, ``+``, ``~``, ``%`` and ``**`` on sequences, strings and integers, ``str.format``
  widths, and every call or filter argument that would build a larger result are refused
  before anything is allocated (intercepted operators are also never folded at compile time);
- the output is streamed (``Template.generate``) and its running size checked;
- the clock is read inside every ``range`` loop and on attribute/item accesses and calls, so
  a loop that writes nothing stops too, and a thread running a runaway template is free
  within the time limit (SIGTERM during a runaway render: exit 143 in 0.4 s).

The checks cost time: an 8-turn Llama-3-style conversation with its span probes renders in
0.64 ms instead of 0.37 ms, mostly because every ``+`` goes through the sandbox.

"""

from __future__ import annotations

import functools
import json
import math
import re
import string
import threading
import time
from functools import lru_cache

from ..errors import PacktoolError

DEFAULT_MAX_RENDER_CHARS = 1 << 25
DEFAULT_RENDER_TIMEOUT = 10.0


class TemplateError(PacktoolError):
    """A chat template that fails to render a conversation (a bad record, when skipping)."""

    reason = "chat_template"


class RenderLimit(TemplateError):
    """A render over ``max_render_chars`` characters or ``render_timeout`` seconds."""

    reason = "render_limit"


class _Raised(Exception):
    """The template's own ``raise_exception(message)``."""


class _State(threading.local):
    """The limits of the render running in this thread (templates are shared by threads)."""

    max_chars = DEFAULT_MAX_RENDER_CHARS
    timeout = DEFAULT_RENDER_TIMEOUT
    deadline = math.inf
    ops = 0
    emitted = 0    # characters the template has yielded so far
    spans = None   # a list collecting {% generation %} spans, or None


_state = _State()


def _too_big(n: int, what: str) -> None:
    if n > _state.max_chars:
        raise RenderLimit(f"{what} would make {n:,} characters, over --max-render-chars "
                          f"{_state.max_chars:,}; raise --max-render-chars or fix the template")


def _check_clock() -> None:
    if time.monotonic() > _state.deadline:
        raise RenderLimit(f"rendering took over --render-timeout {_state.timeout:g} s; raise "
                          "--render-timeout or fix the template")


def _tick() -> None:
    _state.ops += 1
    if not _state.ops & 63:
        _check_clock()


_SEQ = (str, list, tuple)
_PERCENT = re.compile(r"%[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent(fmt: str, args) -> None:
    widths = [int(w) for m in _PERCENT.finditer(fmt) for w in m.groups() if w and w != "*"]
    if "*" in fmt:
        widths += [abs(v) for v in (args if isinstance(args, tuple) else (args,))
                   if isinstance(v, int)]
    _too_big(len(fmt) + sum(widths), "a %-format")


def _check_format(fmt: str) -> None:
    try:
        specs = [spec or "" for _, _, spec, _ in string.Formatter().parse(fmt)]
    except ValueError:
        return  # the call itself raises the error
    _too_big(len(fmt) + sum(int(d) for s in specs for d in re.findall(r"\d+", s)), "a format")


def _check_join(sep, items) -> None:
    if isinstance(sep, str) and isinstance(items, (list, tuple)):
        _too_big(sum(len(x) for x in items if isinstance(x, str))
                 + len(sep) * max(len(items) - 1, 0), "a join")


def _check_replace(s, old, new) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        count = s.count(old) if old else len(s) + 1
        _too_big(len(s) + count * (len(new) - len(old)), "a replace")


def _check_args(args, kwargs) -> None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool):
            _too_big(abs(v), f"an argument of {v:,}")


def _check_call(obj, args, kwargs) -> None:
    _tick()
    _check_args(args, kwargs)
    target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in ("format", "format_map"):
        _check_format(owner)
    elif name == "join" and args:
        _check_join(owner, args[0])
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1])
    elif name == "expandtabs":
        size = (args or (kwargs.get("tabsize", 8),))[0]
        if isinstance(size, int):
            _too_big(len(owner) + owner.count("\t") * size, "expandtabs")


def _guard_filter(name: str, fn):
    """A filter that refuses, before running, arguments that ask for an oversized result,
    and checks the size of what it returns."""
    from jinja2.utils import _PassArg

    skip = 1 if _PassArg.from_obj(fn) else 0  # context/eval-context/environment first

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        if len(args) == skip + 1 and not kwargs:  # ``value | filter``: check the result only
            out = fn(*args)
            if isinstance(out, _SEQ) and len(out) > _state.max_chars:
                _too_big(len(out), f"the {name} filter")
            return out
        _check_call(None, args[skip:], kwargs)
        value, rest = (args[skip], args[skip + 1:]) if len(args) > skip else (None, ())
        if name == "replace" and len(rest) >= 2:
            _check_replace(value, rest[0], rest[1])
        elif name == "format" and isinstance(value, str):
            _check_percent(value, tuple(rest))
        elif name == "join":
            _check_join(rest[0] if rest else kwargs.get("d", ""), value)
        elif name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            width = len(width) if isinstance(width, str) else width
            if isinstance(width, int):
                _too_big(len(value) + (value.count("\n") + 1) * width, "an indent")
        out = fn(*args, **kwargs)
        if isinstance(out, _SEQ):
            _too_big(len(out), f"the {name} filter")
        return out

    return guarded


def _check_binop(op: str, a, b) -> None:
    _tick()
    if op == "*":
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, _SEQ) and isinstance(n, int):
                _too_big(len(seq) * max(n, 0), "a repetition")
    elif op == "+" and isinstance(a, _SEQ) and isinstance(b, _SEQ):
        _too_big(len(a) + len(b), "a concatenation")
    elif op == "%" and isinstance(a, str):
        _check_percent(a, b)
    elif op == "**" and isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        _too_big(int(abs(a).bit_length() * b * 0.30103), "a power")  # decimal digits


class _Range:
    """``range`` as Jinja's sandbox allows it (at most 100,000 items), reading the clock as
    it is iterated: a nested loop that writes nothing still stops at the time limit."""

    def __init__(self, *args):
        from jinja2.sandbox import safe_range

        self._r = safe_range(*args)

    def __iter__(self):
        for i in self._r:
            _tick()
            yield i

    def __reversed__(self):
        for i in reversed(self._r):
            _tick()
            yield i

    def __len__(self):
        return len(self._r)

    def __getitem__(self, k):
        return self._r[k]

    def __contains__(self, x):
        return x in self._r

    def __repr__(self):
        return repr(self._r)


def _lipsum(n=5, html=True, min=20, max=100):  # Jinja's own argument names
    from jinja2.utils import generate_lorem_ipsum

    _too_big(n * max * 12, "lipsum")  # words of at most ~11 characters and a space
    return generate_lorem_ipsum(n, html, min, max)


def _generation_extension():
    """The ``{% generation %}`` extension (jinja2 is imported here, on first use)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``: records where its text lands."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_generation_support")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation_support(self, caller):
            text = caller()
            if _state.spans is not None:  # everything before it has been yielded already
                _state.spans.append((_state.emitted, _state.emitted + len(text)))
            return text

    return Generation


def _environment_class():
    """The environment that checks every operation against the limits."""
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Codegen(CodeGenerator):
        def visit_Concat(self, node, frame):  # ``a ~ b``: a checked join
            self.write("environment.checked_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Environment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "%", "**"})
        code_generator_class = Codegen

        def call_binop(self, context, operator, left, right):
            if operator == "+" and type(left) is str and type(right) is str:  # the usual case
                if len(left) + len(right) > _state.max_chars:
                    _too_big(len(left) + len(right), "a concatenation")
                return left + right
            _check_binop(operator, left, right)
            return self.binop_table[operator](left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # Jinja's signature
            _check_call(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def getitem(self, obj, argument):
            _tick()
            return super().getitem(obj, argument)

        def getattr(self, obj, attribute):
            _tick()
            return super().getattr(obj, attribute)

        def checked_concat(self, values):
            parts = [str(v) for v in values]
            _too_big(sum(map(len, parts)), "a ~ concatenation")
            return "".join(parts)

    return Environment


def _raise_exception(message):
    raise _Raised(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    from datetime import datetime

    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment():
    """A sandbox rendering as Hugging Face does (``trim_blocks``, ``lstrip_blocks``,
    ``raise_exception``, ``tojson``, ``{% generation %}``), with the limits above."""
    generation = _generation_extension()
    env = _environment_class()(trim_blocks=True, lstrip_blocks=True,
                      extensions=["jinja2.ext.loopcontrols", generation])
    env.filters["tojson"] = _tojson
    env.filters = {name: _guard_filter(name, fn) for name, fn in env.filters.items()}
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       range=_Range, lipsum=_lipsum)
    return env


@lru_cache(maxsize=8)
def compile_template(source: str, name: str):
    """(template, marks generation spans, reads content parts)."""
    from jinja2 import TemplateSyntaxError, nodes

    env = _environment()
    try:
        ast = env.parse(source)
        template = env.from_string(ast)
    except TemplateSyntaxError as e:
        raise PacktoolError(f"{name} line {e.lineno} does not compile: {e.message}") from None
    generation = any(n.name == "_generation_support"
                     for n in ast.find_all(nodes.ExtensionAttribute))
    parts = any(isinstance(n.arg, nodes.Const) and n.arg.value in ("type", "text")
                for n in ast.find_all(nodes.Getitem)) or \
        any(n.attr in ("type", "text") for n in ast.find_all(nodes.Getattr))
    return template, generation, parts


def _template_line(tb) -> str:
    """The template line a rendering error was raised at (Jinja rewrites the traceback so
    that template frames carry template line numbers)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" line {line}" if line else ""


def render(template, variables: dict, messages: list, name: str, max_chars: int,
           timeout: float, spans: list | None = None, generation_prompt: bool = False) -> str:
    """``template`` rendered for ``messages`` within the limits; ``{% generation %}`` spans
    appended to ``spans`` when given. Every failure is a :class:`TemplateError` naming the
    template and its line."""
    s = _state
    s.max_chars, s.timeout, s.emitted, s.spans = max_chars, timeout, 0, spans
    s.deadline = deadline = time.monotonic() + timeout
    chunks, size, clock = [], 0, time.monotonic
    try:
        for chunk in template.generate(messages=messages,
                                       add_generation_prompt=generation_prompt,
                                       **variables):
            size += len(chunk)
            if size > max_chars:
                _too_big(size, "the rendered conversation")
            if clock() > deadline:
                _check_clock()
            if spans is not None:
                s.emitted = size
            chunks.append(chunk)
    except RecursionError:
        raise TemplateError(f"{name}: recursion too deep") from None
    except Exception as e:
        where = f"{name}{_template_line(e.__traceback__)}"
        if isinstance(e, TemplateError):
            raise type(e)(f"{where}: {e}") from None
        if isinstance(e, _Raised):
            raise TemplateError(f"{where}: {e}") from None
        raise TemplateError(f"{where}: {type(e).__name__}: {e}") from None
    finally:
        s.deadline, s.spans = math.inf, None
    return "".join(chunks)
