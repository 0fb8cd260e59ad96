"""Chat conversations -> one rendered string plus the character spans trained on.

The template is the tokenizer folder's ``tokenizer_config.json`` ``chat_template`` (Jinja,
rendered as Hugging Face ``apply_chat_template`` does: sandboxed, ``trim_blocks`` and
``lstrip_blocks``, ``raise_exception``, ``tojson``, ``bos_token``/``eos_token`` variables),
``--chat-template FILE``, or the built-in :data:`DEFAULT_TEMPLATE`::

    {{ bos_token }}<|user|>
    How are you?
    <|assistant|>
    Fine.{{ eos_token }}

Which characters are trained on (``--train-on assistant``): for every assistant message, from
the start of its content to the end of its turn as the template renders it (so the
end-of-turn marker the template writes after the content, e.g. ``<|eot_id|>`` or the EOS, is
learned; the role header before it is not). The content is located exactly by rendering the
conversation again with it replaced by a marker (so trimming templates and contents that
also occur in headers or other turns are handled). The end of a turn is where the rendering
of the conversation up to that message stops, when that rendering is a prefix of the whole;
otherwise the content's end. Tokens are then marked by their offsets: a token is trained on
when it overlaps a trained span (so ``ĠFine``/``▁Fine``, whose offsets begin at the space the
template puts before the answer, are trained).

Templates that mark the trained text themselves with Hugging Face's ``{% generation %}`` ...
``{% endgeneration %}`` (what ``apply_chat_template(..., return_assistant_tokens_mask=True)``
reads) are rendered once, and the marked spans are the trained spans: no probing. A
conversation whose rendering marks nothing is kept with no trained token, as HF does.

Message content may be a list of parts, ``[{"type": "text", "text": ...}, ...]`` (only text
parts; the reader refuses others). HF passes such lists to the template unchanged; so does
packtool when the template reads parts (it looks up a ``'type'`` or ``'text'`` key, as every
template written for parts does). A template written for strings would print the list's
Python repr, so for it the text parts are joined (no separator: what part-aware templates
such as Llama 3.2's and Qwen2-VL's write for text-only content).

A template is code, and rendering is bounded. Unbounded, ``{{ 'x' * 2000000000 }}`` asked
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
from pathlib import Path

from .errors import PacktoolError

DEFAULT_TEMPLATE = (  # newlines inside expressions: trim_blocks eats those after a tag
    "{{ bos_token or '' }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token or '' }}{% endif %}{{ '\\n' }}{% endfor %}"
)
BUILTIN = "packtool default"  # the manifest's chat_template value for DEFAULT_TEMPLATE
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


def load_template(tokenizer_path: Path, template_file: str | Path | None) -> tuple[str, str, dict]:
    """(template source, where it came from, special-token variables from the config)."""
    config_path = tokenizer_path.parent / "tokenizer_config.json"
    config = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_bytes())
        except ValueError as e:
            raise PacktoolError(f"{config_path}: invalid JSON ({e})") from None
    variables = {k: _token_str(config.get(k)) for k in ("bos_token", "eos_token")}
    if template_file:
        p = Path(template_file)
        if not p.is_file():
            raise PacktoolError(f"--chat-template {p}: no such file")
        try:
            return p.read_bytes().decode("utf-8"), str(p), variables
        except UnicodeDecodeError as e:
            raise PacktoolError(f"--chat-template {p}: not UTF-8 text ({e.reason} at byte "
                                f"{e.start:,}); save the template as UTF-8") from None
    tpl = config.get("chat_template")
    if isinstance(tpl, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    if isinstance(tpl, str) and tpl:
        return tpl, str(config_path), variables
    return DEFAULT_TEMPLATE, BUILTIN, variables


def chat_renderer(tokenizer_path: Path, opts) -> tuple[ChatRenderer, str, list[str]]:
    """The renderer for a run's conversations, where its template came from, and warnings.
    ``--eos`` names the end-of-turn token the template writes after assistant turns (else
    ``tokenizer_config.json``'s ``eos_token``); the built-in template without one is
    refused, since a model trained on it would never learn to stop."""
    source, origin, variables = load_template(tokenizer_path, opts.chat_template)
    if opts.eos:
        variables["eos_token"] = opts.eos
    warnings = []
    if origin == BUILTIN:
        if not variables.get("eos_token"):
            raise PacktoolError(
                f"{tokenizer_path.parent} has no chat template and names no eos_token, so "
                "packtool's built-in template would write no end-of-turn token and the model "
                "would never learn to stop: pass --eos TOKEN (e.g. --eos '</s>') or "
                "--chat-template FILE")
        warnings.append(
            f"{tokenizer_path.parent} has no chat template (no chat_template in "
            "tokenizer_config.json): used packtool's built-in chat template (<|role|> headers, "
            f"{variables['eos_token']} after assistant turns); pass --chat-template FILE to "
            "choose one")
    renderer = ChatRenderer(source, variables, opts.train_on, origin, opts.max_render_chars,
                            opts.render_timeout)
    return renderer, origin, warnings


def _token_str(v):
    if isinstance(v, dict):  # AddedToken serialised
        return v.get("content")
    return v if isinstance(v, str) else None


# -- bounded rendering ------------------------------------------------------------------------

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


@lru_cache(maxsize=1)
def _environment():
    """A sandbox rendering as Hugging Face does (``trim_blocks``, ``lstrip_blocks``,
    ``raise_exception``, ``tojson``, ``{% generation %}``), with the limits above."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

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

    def raise_exception(message):
        raise _Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = Environment(trim_blocks=True, lstrip_blocks=True,
                      extensions=["jinja2.ext.loopcontrols", Generation])
    env.filters["tojson"] = tojson
    env.filters = {name: _guard_filter(name, fn) for name, fn in env.filters.items()}
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       range=_Range, lipsum=_lipsum)
    return env


@lru_cache(maxsize=8)
def _compile(source: str, name: str):
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


class ChatRenderer:
    """Render conversations and find the trained character spans."""

    def __init__(self, source: str, variables: dict, train_on: str = "assistant",
                 origin: str = "--chat-template", max_chars: int = DEFAULT_MAX_RENDER_CHARS,
                 timeout: float = DEFAULT_RENDER_TIMEOUT):
        if train_on not in ("assistant", "all"):
            raise PacktoolError(f"--train-on {train_on!r}: choose assistant or all")
        if max_chars < 1 or not timeout > 0:
            raise PacktoolError(f"--max-render-chars {max_chars} and --render-timeout {timeout} "
                                "must be positive")
        self.name = ("packtool's built-in chat template" if origin == BUILTIN
                     else f"chat template {origin}")
        self.template, self.generation, self.reads_parts = _compile(source, self.name)
        self.variables = variables
        self.train_on = train_on
        self.max_chars, self.timeout = max_chars, timeout

    def render(self, messages: list[dict], spans: list | None = None) -> str:
        """The conversation as the template writes it; ``{% generation %}`` spans are
        appended to ``spans`` when given."""
        s = _state
        s.max_chars, s.timeout, s.emitted, s.spans = self.max_chars, self.timeout, 0, spans
        s.deadline = deadline = time.monotonic() + self.timeout
        chunks, size, limit, clock = [], 0, self.max_chars, time.monotonic
        try:
            for chunk in self.template.generate(messages=messages, add_generation_prompt=False,
                                                **self.variables):
                size += len(chunk)
                if size > limit:
                    _too_big(size, "the rendered conversation")
                if clock() > deadline:
                    _check_clock()
                if spans is not None:
                    s.emitted = size
                chunks.append(chunk)
        except RecursionError:
            raise TemplateError(f"{self.name}: recursion too deep") from None
        except Exception as e:
            where = f"{self.name}{_template_line(e.__traceback__)}"
            if isinstance(e, TemplateError):
                raise type(e)(f"{where}: {e}") from None
            if isinstance(e, _Raised):
                raise TemplateError(f"{where}: {e}") from None
            raise TemplateError(f"{where}: {type(e).__name__}: {e}") from None
        finally:
            s.deadline, s.spans = math.inf, None
        return "".join(chunks)

    def __call__(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        if not self.reads_parts:
            messages = [_joined(m) for m in messages]
        if self.train_on == "all":
            text = self.render(messages)
            return text, [(0, len(text))]
        if self.generation:
            spans: list[tuple[int, int]] = []
            text = self.render(messages, spans)
            return text, spans
        text = self.render(messages)
        spans = []
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start, end = self._locate(messages, k, text)
            prefix = self.render(messages[: k + 1])
            if text.startswith(prefix) and len(prefix) >= end:
                end = len(prefix)  # through the end-of-turn marker the template writes
            spans.append((start, end))
        return text, spans

    def _locate(self, messages: list[dict], k: int, text: str) -> tuple[int, int]:
        """Where message k's content sits in ``text``: render the conversation again with
        that content replaced by a marker; everything before and after it is unchanged, so
        the marker's position is exact whatever the template adds or trims around it."""
        marker = f"\ue000packtool{k}\ue001"
        content = marker
        if isinstance(messages[k]["content"], list):  # a template that reads parts
            content = [{"type": "text", "text": marker}]
        probe = [dict(m, content=content) if i == k else m for i, m in enumerate(messages)]
        rendered = self.render(probe)
        at = rendered.find(marker)
        if at < 0 or rendered.find(marker, at + 1) >= 0:
            raise TemplateError(
                f"message {k}: the chat template transforms the content, so the assistant's "
                "tokens cannot be located; use --train-on all or another --chat-template")
        suffix = len(rendered) - at - len(marker)
        start, end = at, len(text) - suffix
        if not (text[:start] == rendered[:at] and end >= start):
            raise TemplateError(
                f"message {k}: the chat template renders other messages differently depending "
                "on this one's content; use --train-on all or another --chat-template")
        return start, end


def _joined(message: dict) -> dict:
    """A message whose content parts are joined into one string, for templates written for
    string contents (the reader has refused every part that is not text)."""
    content = message["content"]
    if isinstance(content, list):
        return dict(message, content="".join(p["text"] for p in content))
    return message
