"""verl's own step planner (``verl.utils.seqlen_balancing``), for comparisons, without its stack.

verl 0.9.1's module imports torch, ``verl.protocol`` (Ray, tensordict), ``verl.utils.
tensordict_utils`` (tensordict) and ``verl.utils.device``, and ``import verl`` runs
``verl/__init__.py``, which imports ``verl.protocol`` first. With verl installed as
``pip install --no-deps verl==0.9.1`` (its dependencies pin transformers < 5.11, ray,
tensordict, hydra, wandb ...), :func:`load` reads the installed file and runs it against
three stubs: ``DataProto`` (a placeholder; only ``prepare_dynamic_batch`` uses it),
``get_device_name`` ("cpu") and ``index_select_tensor_dict`` (a dict of tensors indexed by
the positions, what verl's does for dense tensors). The functions compared
(``get_seqlen_balanced_partitions``, ``karmarkar_karp``, ``rearrange_micro_batches``) use
only torch and the standard library. A full install is imported as it is.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types

STUBBED = ("verl", "verl.protocol", "verl.utils", "verl.utils.tensordict_utils",
           "verl.utils.device")


def _stubs() -> dict:
    import torch

    verl, utils = types.ModuleType("verl"), types.ModuleType("verl.utils")
    verl.__path__, utils.__path__ = [], []
    protocol = types.ModuleType("verl.protocol")
    protocol.DataProto = type("DataProto", (), {})
    tu = types.ModuleType("verl.utils.tensordict_utils")
    tu.index_select_tensor_dict = lambda batch, idx: {
        k: v[torch.as_tensor(idx, dtype=torch.long)] for k, v in batch.items()}
    device = types.ModuleType("verl.utils.device")
    device.get_device_name = lambda: "cpu"
    return dict(zip(STUBBED, (verl, protocol, utils, tu, device), strict=True))


def load():
    """(verl's seqlen_balancing module, how it was loaded) or (None, why not)."""
    if all(importlib.util.find_spec(m) for m in ("ray", "tensordict", "hydra")):
        try:
            from verl.utils import seqlen_balancing
            return seqlen_balancing, "verl (full install)"
        except Exception:
            pass
    try:
        dist = importlib.metadata.distribution("verl")
    except importlib.metadata.PackageNotFoundError:
        return None, "verl is not installed: pip install --no-deps verl==0.9.1"
    path = dist.locate_file("verl/utils/seqlen_balancing.py")
    if not path.exists():
        return None, f"verl {dist.version} has no {path}"
    saved = {k: sys.modules.get(k) for k in STUBBED}
    sys.modules.update(_stubs())
    try:
        spec = importlib.util.spec_from_file_location("verl_seqlen_balancing", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:
        return None, f"verl {dist.version}'s seqlen_balancing.py did not load: {e!r}"
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod, f"verl {dist.version}, seqlen_balancing.py run against stubs ({path})"
