"""Chat templates: the file's Jinja template rendered as Hugging Face transformers renders it, in a sandbox."""
import json
from functools import lru_cache
from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Gemma's turn format, for Gemma vocabularies whose GGUF carries no template: a system message opens the first user turn
GEMMA_TEMPLATE = (
  "{{ bos_token }}{% set sys = messages[0]['content'] + '\n\n' if messages and messages[0]['role'] == 'system' else '' %}"
  "{% for m in messages if m['role'] != 'system' %}"
  "{% if (m['role'] == 'user') != (loop.index0 is even) %}{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
  "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ sys if loop.first }}{{ m['content'] | trim }}<end_of_turn>\n"
  "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

def _raise(message: str): raise ValueError(f"chat template: {message}")

def _tojson(value, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
  return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

@lru_cache(maxsize=8)
def compile_template(source: str) -> Template:
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
  env.globals["raise_exception"] = _raise
  env.filters["tojson"] = _tojson
  return env.from_string(source)

def render(source: str, messages: list[dict], add_generation_prompt: bool, bos_token: str, eos_token: str) -> str:
  return compile_template(source).render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token)
