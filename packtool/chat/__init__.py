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

Rendering is bounded (a template is code): :mod:`packtool.chat.sandbox`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PacktoolError
from .sandbox import (
    DEFAULT_MAX_RENDER_CHARS,
    DEFAULT_RENDER_TIMEOUT,
    RenderLimit,
    TemplateError,
    compile_template,
    render,
)

__all__ = ["BUILTIN", "DEFAULT_MAX_RENDER_CHARS", "DEFAULT_RENDER_TIMEOUT", "DEFAULT_TEMPLATE",
           "ChatRenderer", "RenderLimit", "TemplateError", "chat_renderer", "load_template"]

DEFAULT_TEMPLATE = (  # newlines inside expressions: trim_blocks eats those after a tag
    "{{ bos_token or '' }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token or '' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
BUILTIN = "packtool default"  # the manifest's chat_template value for DEFAULT_TEMPLATE


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
        self.template, self.generation, self.reads_parts = compile_template(source, self.name)
        self.variables = variables
        self.train_on = train_on
        self.max_chars, self.timeout = max_chars, timeout

    def render(self, messages: list[dict], spans: list | None = None) -> str:
        """The conversation as the template writes it; ``{% generation %}`` spans are
        appended to ``spans`` when given."""
        return render(self.template, self.variables, messages, self.name, self.max_chars,
                      self.timeout, spans)

    def prompt(self, messages: list[dict]) -> str:
        """A conversation rendered as the prompt of a completion to come (the template's
        ``add_generation_prompt``, as ``apply_chat_template(..., add_generation_prompt=True)``):
        a preference pair's or group's prompt (:mod:`packtool.sources.groups`)."""
        if not self.reads_parts:
            messages = [_joined(m) for m in messages]
        return render(self.template, self.variables, messages, self.name, self.max_chars,
                      self.timeout, None, generation_prompt=True)

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
