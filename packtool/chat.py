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
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .errors import PacktoolError

DEFAULT_TEMPLATE = (  # newlines inside expressions: trim_blocks eats those after a tag
    "{{ bos_token or '' }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token or '' }}{% endif %}{{ '\\n' }}{% endfor %}"
)


class TemplateError(PacktoolError):
    """A chat template that fails to render a conversation."""


def load_template(tokenizer_path: Path, template_file: str | Path | None) -> tuple[str, str, dict]:
    """(template source, where it came from, special-token variables from the config)."""
    config_path = tokenizer_path.parent / "tokenizer_config.json"
    config = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except ValueError as e:
            raise PacktoolError(f"{config_path}: invalid JSON ({e})") from None
    variables = {k: _token_str(config.get(k)) for k in ("bos_token", "eos_token")}
    if template_file:
        p = Path(template_file)
        if not p.is_file():
            raise PacktoolError(f"--chat-template {p}: no such file")
        return p.read_text(), str(p), variables
    tpl = config.get("chat_template")
    if isinstance(tpl, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    if isinstance(tpl, str) and tpl:
        return tpl, str(config_path), variables
    return DEFAULT_TEMPLATE, "packtool default", variables


def _token_str(v):
    if isinstance(v, dict):  # AddedToken serialised
        return v.get("content")
    return v if isinstance(v, str) else None


@lru_cache(maxsize=8)
def _compile(source: str):
    from jinja2 import TemplateError as JinjaError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except JinjaError as e:
        raise PacktoolError(f"chat template does not compile: {e}") from None


class ChatRenderer:
    """Render conversations and find the trained character spans."""

    def __init__(self, source: str, variables: dict, train_on: str = "assistant"):
        if train_on not in ("assistant", "all"):
            raise PacktoolError(f"--train-on {train_on!r}: choose assistant or all")
        self.template = _compile(source)
        self.variables = variables
        self.train_on = train_on

    def render(self, messages: list[dict]) -> str:
        from jinja2 import TemplateError as JinjaError

        try:
            return self.template.render(messages=messages, add_generation_prompt=False,
                                        **self.variables)
        except TemplateError:
            raise
        except (JinjaError, TypeError, KeyError, IndexError) as e:
            raise TemplateError(f"chat template failed: {e}") from None

    def __call__(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        text = self.render(messages)
        if self.train_on == "all":
            return text, [(0, len(text))]
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
        probe = [dict(m, content=marker) if i == k else m for i, m in enumerate(messages)]
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
