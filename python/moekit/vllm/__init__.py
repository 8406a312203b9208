"""moekit inside vLLM: a general plugin that runs vLLM's unquantized MoE layers on moekit.

Opt-in: vLLM calls every installed `vllm.general_plugins` entry point in every process
it starts, so register() does nothing (and imports nothing native) unless MOEKIT_VLLM=1.
With it, and a vLLM version the plugin follows, it replaces vLLM's
UnquantizedFusedMoEMethod (vLLM's documented out-of-tree hook) with moekit's
method: each MoE layer whose configuration moekit serves runs moekit's layer as a
monolithic experts class (routing inside, ids written to vLLM's routing_replay_out,
so vLLM's own RoutedExpertsCapturer records them); every other layer stays vLLM's,
with the reason in report(). docs/vllm.md.

Options (environment, read once by register()):
  MOEKIT_VLLM=1                  enable the plugin
  MOEKIT_VLLM_BACKEND=auto|cpu|cuda_sm90|cuda_sm80  moekit's backend (MoeConfig.backend)
  MOEKIT_VLLM_BATCH_INVARIANT=1  moekit's batch-invariant mode (a token's output does not depend on its batch)
"""
import logging
import os
from typing import Dict, List

logger = logging.getLogger("moekit.vllm")

# The vLLM releases whose internals (the MoE method, the monolithic experts interface, the
# model runner's input batch) this plugin follows: major.minor.
SUPPORTED_VLLM = ("0.32",)

_state = {"registered": False}


def _version_supported(version: str) -> bool:
    return ".".join(version.split(".")[:2]) in SUPPORTED_VLLM


def register() -> None:
    """The `vllm.general_plugins` entry point (safe to call more than once)."""
    if os.environ.get("MOEKIT_VLLM", "0") != "1" or _state["registered"]:
        return
    import vllm
    if not _version_supported(vllm.__version__):
        logger.warning("moekit.vllm: vLLM %s is not a version this plugin follows (%s.x); leaving vLLM's MoE as it is",
                       vllm.__version__, ", ".join(SUPPORTED_VLLM))
        return
    from . import _method, _replay
    _method.install(_method.Options.from_env())
    _replay.install()
    _state["registered"] = True
    logger.info("moekit.vllm: vLLM %s's unquantized MoE layers run on moekit where it serves them", vllm.__version__)


def report() -> List[Dict[str, object]]:
    """One entry per vLLM MoE layer built in this process since register(): {"layer", "replaced", "backend",
    "kernel", "reason"} (replaced=False: vLLM's own method runs it, and reason says why)."""
    from . import _method
    return [dict(r) for r in _method.REPORT]


def refresh() -> int:
    """After writing a selection bias (DeepSeek's e_score_correction_bias) other than through vLLM's
    reload_weights: every replaced layer re-reads it. Returns how many layers did."""
    from . import _method
    return _method.refresh()


__all__ = ["SUPPORTED_VLLM", "refresh", "register", "report"]
