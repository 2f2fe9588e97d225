"""Resolve the ``MODEL`` argument of the whole-model commands to an ``nn.Module``.

Three sources:

- a built-in model name (``gpt2``, ``llama-160m``, ...): ``kwargs`` are configuration overrides;
- ``path/to/file.py:ClassName``: the file is imported as a fresh module (its directory on
  ``sys.path`` meanwhile, so that it can import its neighbours) and ``ClassName(**kwargs)``
  called; ``ClassName`` may also be a function returning a module;
- a Hugging Face config (``hf_config``: a hub name or a local directory): built with
  ``from_config``, random weights, nothing but the config file downloaded. transformers is
  optional and imported only here.

The model is built on ``device`` directly (``torch.device`` as a context manager), so a large
model never passes through host memory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kernelsmith.extras import install_hint

logger = logging.getLogger(__name__)

HF_EXTRA_HINT = install_hint("hf")


@dataclass
class LoadedModel:
    """A resolved model: the module, the name it was asked by, and where it came from
    (``"builtin"``, ``"file"`` or ``"hf-config"``)."""

    module: nn.Module
    name: str
    source: str


def load_model(
    model: str | None,
    *,
    kwargs: dict[str, Any] | None = None,
    hf_config: str | None = None,
    tiny: bool = False,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Build the model named by ``model`` (or ``hf_config``) on ``device``.

    >>> load_model("gpt2", tiny=True).module.config.n_layers
    2
    >>> load_model("models/my_net.py:Net", kwargs={"width": 256})   # doctest: +SKIP
    """
    kwargs = dict(kwargs or {})
    if (model is None) == (hf_config is None):
        raise ValueError("give exactly one model: a built-in name, path/to/file.py:ClassName, or --hf-config")
    if hf_config is not None:
        if tiny:
            raise ValueError("--tiny applies to built-in models; shrink a Hugging Face config with --kwargs")
        return LoadedModel(_from_hf_config(hf_config, kwargs, device), hf_config, "hf-config")
    assert model is not None
    path, sep, attribute = model.rpartition(":")
    if sep and path.endswith(".py"):
        if tiny:
            raise ValueError("--tiny applies to built-in models; pass the sizes to your class with --kwargs")
        return LoadedModel(_from_file(Path(path), attribute, kwargs, device), model, "file")
    from kernelsmith.models import get_model

    return LoadedModel(get_model(model, tiny=tiny, device=device, **kwargs), model, "builtin")


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence the model's configuration declares, if it declares one."""
    config = getattr(model, "config", None)
    for attribute in ("max_positions", "max_position_embeddings", "n_positions"):
        value = getattr(config, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _from_file(path: Path, attribute: str, kwargs: dict[str, Any], device: str | torch.device) -> nn.Module:
    if not path.is_file():
        raise FileNotFoundError(f"no model file {path}")
    if not attribute.isidentifier():
        raise ValueError(f"{attribute!r} is not a class name: expected path/to/file.py:ClassName")
    # A module name unique to the file's path: two files called model.py do not collide, and
    # dataclasses and pickling find the module in sys.modules.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    module_name = f"kernelsmith_user_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    factory = getattr(module, attribute, None)
    if factory is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == module_name
        )
        raise ValueError(f"{path} defines no {attribute!r} (its nn.Module classes: {', '.join(defined) or 'none'})")
    if not callable(factory):
        raise ValueError(f"{path}:{attribute} is not a class or function")
    with torch.device(device):
        try:
            built = factory(**kwargs)
        except TypeError as err:
            raise ValueError(
                f"{path}:{attribute}(**{kwargs}) failed: {err} (pass constructor arguments with --kwargs)"
            ) from err
    if not isinstance(built, nn.Module):
        raise ValueError(f"{path}:{attribute}(...) returned a {type(built).__name__}, not an nn.Module")
    return built


def _from_hf_config(name_or_path: str, overrides: dict[str, Any], device: str | torch.device) -> nn.Module:
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"--hf-config needs Hugging Face transformers: {HF_EXTRA_HINT}") from err
    config = transformers.AutoConfig.from_pretrained(name_or_path, **overrides)
    logger.info("building %s from its config (random weights, no download of weights)", config.model_type)
    with torch.device(device):
        try:
            return transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:  # an encoder such as BERT has no causal-LM class: the bare model
            return transformers.AutoModel.from_config(config)
