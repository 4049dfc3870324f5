"""Hugging Face weights: a state dict read from a .bin/.pt or .safetensors file and loaded into `BertForPreTraining`,
whose parameters carry Hugging Face's names (`model.init_checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.errors import CheckpointError
from trainer.model import BertForPreTraining

# What to do about a weights file that cannot serve
GIVE = "give an HF state dict (.bin/.pt) or .safetensors file, or none"


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from a .safetensors file or a torch-saved .bin/.pt file (tensors only)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist (model.init_checkpoint)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file: say which one
        detail = "the file is empty" if path.stat().st_size == 0 else str(e).strip()
        if "WeightsUnpickler error:" in detail:  # PyTorch's advice to load with weights_only=False would run code
            why = detail.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n")[0].strip()
            detail = f"not tensors that torch.load reads without running code ({why})"
        raise CheckpointError(f"cannot read weights file {path} (model.init_checkpoint): "
                              f"{detail or type(e).__name__}; {GIVE}") from e  # fmt: skip
    state = state.get("model", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"weights file {path} (model.init_checkpoint) holds a {type(state).__name__}, not a "
                              "state dict (parameter names mapped to tensors, as `torch.save(model.state_dict())` "
                              f"writes); {GIVE}")  # fmt: skip
    return state


def _hf_key(key: str) -> str:
    key = key.removeprefix("module.")  # saved from DDP
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def load_hf_state_dict(model: BertForPreTraining, state: dict[str, torch.Tensor]) -> None:
    """Load HF `BertForPreTraining` weights; an unpadded vocabulary is padded with zero rows."""
    own = model.state_dict()
    converted = {}
    for key, value in state.items():
        key = _hf_key(key)
        if key in ("cls.predictions.decoder.bias", "bert.embeddings.position_ids"):
            continue  # decoder.bias is tied to cls.predictions.bias in HF; position_ids is a buffer
        if key not in own:
            raise CheckpointError(f"weights have a key {key!r} that BertForPreTraining does not have")
        target = own[key]
        if value.shape != target.shape and value.shape[1:] == target.shape[1:] and len(value) < len(target):
            value = torch.cat([value, value.new_zeros(len(target) - len(value), *value.shape[1:])])
        if value.shape != target.shape:
            raise CheckpointError(
                f"weights key {key!r} has shape {tuple(value.shape)}, the model expects {tuple(target.shape)}; "
                "check model.* sizes against the checkpoint's config"
            )
        converted[key] = value
    missing = set(own) - set(converted) - {"cls.predictions.decoder.weight"}
    if missing:
        raise CheckpointError(f"weights lack {len(missing)} keys, e.g. {sorted(missing)[:3]}")
    model.load_state_dict(converted, strict=False)
