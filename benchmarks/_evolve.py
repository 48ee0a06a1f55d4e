"""Stock ``mergekit-evolve`` on a CPU-only machine, with a shim for each of the four places it stops
and nothing else changed:

- mergekit 0.1.5's evolve modules name ``lm_eval.models.vllm_causallms.VLLM`` at import (a type hint
  and ``monkeypatch_lmeval_vllm``), which lm-eval 0.4.13 imports only where vLLM is installed; a
  placeholder module stands in for it (``--vllm`` stays off, so nothing calls it);
- its evaluator empties the accelerator's cache before each merge (``torch.cpu.empty_cache()``),
  which torch's CPU module does not have; a no-op stands in for it;
- lm-eval's HF model is placed on ``device="cuda"`` unless told otherwise, and evolve does not tell
  it; where CUDA is not available its default becomes ``"cpu"``;
- every Ray actor and task evolve starts asks for one GPU, so the Ray cluster is started declaring
  one (``ray.init(num_gpus=1)``); torch still runs on the CPU (``--no-merge-cuda``).

    python benchmarks/_evolve.py GENOME.yml --storage-path DIR --no-merge-cuda [mergekit-evolve's options]
"""

import os
import sys
import types
from pathlib import Path


def install() -> None:
    """The placeholder for lm-eval's vLLM model module where vLLM is not installed, the CPU's
    ``empty_cache`` and lm-eval's device (every Ray worker runs it)."""
    import lm_eval.models
    import lm_eval.models.huggingface
    import torch

    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None
    if not torch.cuda.is_available():
        model = lm_eval.models.huggingface.HFLM
        placed = model.__init__

        def on_cpu(self, *args, device: str = "cpu", **kwargs):
            placed(self, *args, device=device, **kwargs)

        model.__init__ = on_cpu

    try:
        import lm_eval.models.vllm_causallms  # noqa: F401
    except ImportError:
        stub = types.ModuleType("lm_eval.models.vllm_causallms")
        stub.VLLM = type("VLLM", (), {"__doc__": "vLLM is not installed: a placeholder, never called."})
        sys.modules[stub.__name__] = stub
        lm_eval.models.vllm_causallms = stub


def main() -> None:
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    install()
    ray.init(
        address="local",
        num_cpus=int(os.environ.get("EVOLVE_CPUS", "1")),
        num_gpus=1,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "_evolve.install"},
    )
    from mergekit.scripts.evolve import main as evolve

    evolve(prog_name="mergekit-evolve")


if __name__ == "__main__":
    main()
