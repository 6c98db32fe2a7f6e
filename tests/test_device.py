"""``--device cpu|cuda|auto`` (issue 19, item 2; docs/design.md section 13).

On every machine: ``cpu`` and ``auto`` (where no GPU is available) give
exactly the default's results; a cuda request without a GPU is a one-line
exit-2 error; the device round-trips through the run directory's config; and
an emulated strict accelerator (:class:`StrictDevice`, below) checks that no
operation of a run or an attack mixes tensors on the run's device with CPU
tensors, which a GPU would refuse.

With a GPU (``torch.cuda.is_available()``): every backbone preset, FedEM
(elastic merging, similarity aggregation), LDP noise and the attacks run on
cuda, keep their state there and agree with the CPU run within float
tolerance. Float64 for the multi-round comparisons: GPU reductions sum in
another order, and over several rounds Adam's m / sqrt(v) turns float32
rounding into O(lr) steps where a gradient nearly cancels (see
tests/test_backbones.py), while float64 paths agree to rounding.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from collections import Counter

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from fedem_private import api
from fedem_private.device import resolve
from fedem_private.errors import UserError
from fedem_private.simulation.config import (
    RunConfig,
    identity_dict,
    load_toml,
    to_dict,
    with_overrides,
)
from fedem_private.simulation.loop import Simulation

CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device: the GPU comparison runs only "
                               "where torch.cuda.is_available()")
no_gpu = pytest.mark.skipif(CUDA, reason="a CUDA device is available here: a cuda request is "
                            "not an error")


def _cfg(**over) -> RunConfig:
    base = {"train.rounds": 2, "train.local_epochs": 2, "train.batch_size": 32, "train.dim": 8,
            "train.eval_every": 1}
    base.update(over)
    return with_overrides(RunConfig(), base)


def _state(sim: Simulation) -> dict[str, torch.Tensor]:
    """Every client- and server-side tensor worth comparing, on the CPU."""
    st = sim.state
    out = {"q_local": st.q_local, "q_global": sim.aggregator.table}
    out.update({f"private.{n}": t for n, t in st.private.items()})
    out.update({f"dense_local.{n}": t for n, t in st.dense_local.items()})
    if sim.dense is not None:
        out.update({f"dense.{n}": t for n, t in sim.dense.params.items()})
    if sim.merger.state is not None:
        out.update({f"adapter.w{j}": w for j, w in enumerate(sim.merger.state.weights)})
    return {n: t.detach().cpu() for n, t in out.items() if t is not None}


def _run(cfg: RunConfig, split) -> tuple[Simulation, list[dict]]:
    sim = Simulation(cfg, split)
    return sim, [h.metrics for h in sim.run()]


# ------------------------------------------------------------------ every machine


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("over", [
    {"federation.method": "fedem"},
    {"federation.method": "fedncf", "privacy.mode": "ldp-laplace", "privacy.epsilon": 8.0,
     "privacy.clip": 5.0},
], ids=["fedem", "fedncf-ldp"])
def test_cpu_and_auto_give_exactly_the_default(small_split, device, over):
    if device == "auto" and CUDA:
        pytest.skip("auto resolves to cuda here; the GPU tests compare it within tolerance")
    base_sim, base_metrics = _run(_cfg(**over), small_split)
    sim, metrics = _run(_cfg(**over, **{"train.device": device}), small_split)
    assert sim.cfg.train.device == "cpu" and sim.device == torch.device("cpu")
    assert metrics == base_metrics
    ref = _state(base_sim)
    got = _state(sim)
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name


def test_device_names_resolve_and_stay_out_of_a_cpu_config_identity():
    assert RunConfig().train.device == "cpu"
    assert RunConfig().resolved().train.device == "cpu"
    auto = _cfg(**{"train.device": "auto"}).validate().resolved()
    assert auto.train.device == ("cuda" if CUDA else "cpu")
    # a cpu run's identity (config_id, sweep digests) is what it was before the field existed
    assert "device" not in identity_dict(RunConfig().resolved())["train"]
    with pytest.raises(UserError, match="must be one of cpu, cuda, auto"):
        _cfg(**{"train.device": "tpu"}).validate()


@no_gpu
def test_cuda_request_without_a_gpu_is_a_user_error():
    with pytest.raises(UserError, match="no CUDA device"):
        resolve("cuda")
    with pytest.raises(UserError, match="no CUDA device"):
        _cfg(**{"train.device": "cuda"}).validate().resolved()


def _one_line_error(args: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "fedem_private", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@no_gpu
def test_cuda_without_a_gpu_on_the_command_line(tmp_path):
    line = _one_line_error(["run", "--device", "cuda", "--rounds", "1", "--out",
                            str(tmp_path / "r")])
    assert "cuda" in line and "no CUDA device" in line
    assert not (tmp_path / "r").exists()
    run_dir = tmp_path / "done"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    line = _one_line_error(["attack", str(run_dir), "--device", "cuda"])
    assert "no CUDA device" in line
    assert not (run_dir / "attacks.json").exists()


def test_unknown_device_on_the_command_line(tmp_path):
    line = _one_line_error(["run", "--device", "tpu", "--rounds", "1", "--out",
                            str(tmp_path / "r")])
    assert "--device (train.device) must be one of cpu, cuda, auto" in line


def test_device_round_trips_through_the_run_directory(tmp_path):
    cfg = {"data": {"synthetic": {"n_users": 30, "n_items": 60}},
           "train": {"rounds": 1, "local_epochs": 1, "dim": 4, "device": "auto"}}
    res = api.run(cfg, tmp_path / "r")
    written = load_toml(tmp_path / "r" / "config.toml")
    # auto is written as what ran, so re-running the directory's config runs there again
    assert written.train.device == res.config.train.device == ("cuda" if CUDA else "cpu")
    assert to_dict(written) == to_dict(res.config)
    if not CUDA:  # the saved config re-creates the run, bit for bit
        again = api.run(tmp_path / "r" / "config.toml", tmp_path / "again")
        assert again.metrics.drop(columns="seconds").equals(res.metrics.drop(columns="seconds"))


# ------------------------------------------------- an emulated strict accelerator

class StrictDevice(TorchFunctionMode):
    """Treat the CPU as a strict accelerator: find every op that mixes device and CPU tensors.

    Tensors put on "the device" (``.to(cpu)``, a factory's ``device=cpu``; the
    simulation's device is cpu here) are marked, and so is every result of an
    op on a marked tensor; ``.cpu()`` gives an unmarked copy. An op whose
    inputs mix a marked tensor with an unmarked one of dimension > 0, or
    ``.numpy()`` of a marked tensor, is what a GPU would refuse: it is counted
    in :attr:`problems` with where it happened. Stricter than CUDA, which also
    accepts CPU index tensors in advanced indexing.
    """

    SKIP = {"__repr__", "__format__", "__str__", "dim", "size", "numel", "element_size",
            "__len__", "data_ptr", "stride", "is_contiguous", "__bool__", "__float__",
            "__int__", "__index__", "item", "tolist", "__hash__", "requires_grad_"}

    def __init__(self) -> None:
        super().__init__()
        self.problems: Counter[str] = Counter()

    @staticmethod
    def marked(t: object) -> bool:
        return getattr(t, "_on_device", False)

    @staticmethod
    def _mark(out: object, value: bool) -> None:
        if isinstance(out, torch.Tensor):
            out._on_device = value  # type: ignore[attr-defined]
        elif isinstance(out, tuple | list):
            for o in out:
                StrictDevice._mark(o, value)

    def _flag(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-3]
                  if "fedem_private" in f.filename or "attacks" in f.filename]
        where = " <- ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:"
                            f"{f.lineno}" for f in frames[::-1][:4])
        self.problems[f"{what} at {where}"] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        out = func(*args, **kwargs)
        if name == "__get__":  # a property (.T, .mT, .data): keeps the mark
            if isinstance(out, torch.Tensor) and args and self.marked(args[0]):
                self._mark(out, True)
            return out
        if name in self.SKIP:
            return out
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_device = any(self.marked(t) for t in tensors)
        if name == "cpu":
            out = out.clone() if out is args[0] else out
            self._mark(out, False)
            return out
        if name == "numpy":
            if on_device:
                self._flag("numpy() of a device tensor")
            return out
        target = kwargs.get("device")
        target = next((a for a in args[1:] if isinstance(a, torch.device | str)), target)
        if target is not None:
            self._mark(out, torch.device(target).type == "cpu")
            if name == "to" or not tensors:  # a move, or a factory
                return out
        cpu = [tuple(t.shape) for t in tensors if not self.marked(t) and t.dim() > 0]
        if on_device and cpu:
            self._flag(f"{name} mixes device and CPU tensors {cpu}")
        if on_device and target is None:
            self._mark(out, True)
        return out


@pytest.mark.parametrize("over", [
    {"federation.method": "fedem"},
    {"federation.method": "fedem", "federation.merge": "dm",
     "federation.adapter_objective": "holdout"},
    {"federation.method": "fedncf", "privacy.mode": "ldp-laplace", "privacy.epsilon": 8.0,
     "privacy.clip": 5.0},
    {"federation.method": "pfedrec", "federation.codec": "hash", "federation.peft_warmup": 1},
    {"federation.method": "fedmf", "federation.merge": "em", "federation.codec": "lora",
     "federation.peft_warmup": 1},
    {"federation.method": "gpfedrec"},
    {"federation.method": "fedrap", "privacy.mode": "ldp-touched-rows",
     "privacy.epsilon": 8.0, "privacy.clip": 5.0},
    {"federation.method": "fedmerge", "privacy.mode": "paper", "privacy.paper_clip": 0.5,
     "privacy.paper_lambda": 0.01},
    {"federation.method": "fedmf", "privacy.mode": "cdp-gaussian", "privacy.epsilon": 8.0,
     "privacy.delta": 1e-5, "privacy.clip": 1.0, "privacy.sample_rate": 0.5},
    {"federation.method": "fedmf", "privacy.mode": "ldp-gaussian", "privacy.epsilon": 8.0,
     "privacy.delta": 1e-5, "privacy.clip_auto": True, "privacy.clip": None,
     "train.client_fraction": 0.5},
    {"federation.method": "fedem", "train.state_dtype": "bfloat16"},
], ids=["fedem", "dm-holdout", "fedncf-ldp", "pfedrec-hash", "em-lora", "gpfedrec",
        "fedrap-touched", "fedmerge-paper", "cdp", "clip-auto-fraction", "fedem-bf16"])
def test_no_op_mixes_device_and_cpu_tensors(small_split, over):
    """Each part keeps its work on the run's device (emulated; see StrictDevice)."""
    mode = StrictDevice()
    with mode:
        sim = Simulation(_cfg(**over), small_split)
        sim.run()
    assert not mode.problems, "\n".join(f"{n} x {p}" for p, n in mode.problems.items())
    kept = {"q_local": sim.state.q_local, "q_global": sim.aggregator.table, **sim.state.private,
            **sim.state.dense_local}
    assert all(mode.marked(t) for t in kept.values() if t is not None)


def test_attacks_keep_their_work_on_the_device(tmp_path):
    """projection and IMIA's shadow training on the emulated device (see StrictDevice)."""
    from attacks.run import run_attacks

    cfg = {"data": {"synthetic": {"n_users": 30, "n_items": 60}},
           "train": {"rounds": 1, "local_epochs": 1, "dim": 4},
           "record": {"rounds": "last", "clients": 20}}
    api.run(cfg, tmp_path / "r")
    mode = StrictDevice()
    with mode:
        on = run_attacks(tmp_path / "r", ["projection", "imia"], device="cpu", write=False)
    assert not mode.problems, "\n".join(f"{n} x {p}" for p, n in mode.problems.items())
    plain = run_attacks(tmp_path / "r", ["projection", "imia"], write=False)
    assert [r["relations"] for r in on["records"]] == [r["relations"] for r in plain["records"]]


# ------------------------------------------------------------------ with a GPU

PRESETS = [
    {"federation.method": "fedmf"},
    {"federation.method": "fedem"},  # elastic merging (em), similarity aggregation
    {"federation.method": "fedncf"},
    {"federation.method": "pfedrec"},
    {"federation.method": "gpfedrec"},
    {"federation.method": "fedrap"},
    {"federation.method": "fedmerge"},
]


def _assert_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                  tol: float) -> None:
    assert got.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=tol, atol=tol, msg=name)


def _assert_metrics_close(got: list, ref: list, n_users: int) -> None:
    """Equal up to one near-tie flipped by rounding: a rank moves by one, a metric by <= 1/n."""
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        for kind in r:
            for key, value in r[kind].items():
                assert g[kind][key] == pytest.approx(value, abs=1.0 / n_users + 1e-12)


@needs_gpu
@pytest.mark.parametrize("over", PRESETS, ids=[o["federation.method"] for o in PRESETS])
def test_gpu_run_agrees_with_cpu(small_split, float64, over):
    cfg = _cfg(**over, **{"train.rounds": 3})
    cpu_sim, cpu_metrics = _run(cfg, small_split)
    gpu_sim, gpu_metrics = _run(with_overrides(cfg, {"train.device": "cuda"}), small_split)
    assert gpu_sim.device.type == "cuda"
    st = gpu_sim.state
    on_gpu = [st.q_local, gpu_sim.aggregator.table, *st.private.values(),
              *st.dense_local.values()]
    if gpu_sim.merger.state is not None:
        on_gpu += list(gpu_sim.merger.state.weights)
    assert all(t.device.type == "cuda" for t in on_gpu if t is not None)
    assert st.q_local.dtype == torch.float64
    _assert_close(_state(gpu_sim), _state(cpu_sim), tol=1e-7)
    _assert_metrics_close(gpu_metrics, cpu_metrics, small_split.n_users)


@needs_gpu
@pytest.mark.parametrize("over", [
    {"federation.method": "fedem"},
    {"federation.method": "fedmf", "privacy.mode": "ldp-laplace", "privacy.epsilon": 8.0,
     "privacy.clip": 5.0},
    {"federation.method": "fedmf", "privacy.mode": "cdp-gaussian", "privacy.epsilon": 8.0,
     "privacy.delta": 1e-5, "privacy.clip": 1.0, "privacy.sample_rate": 0.5},
], ids=["fedem", "ldp-laplace", "cdp-gaussian"])
def test_gpu_round_agrees_with_cpu_in_float32(small_split, over):
    """One float32 round of one local epoch (the default dtype; more epochs amplify float32
    rounding, see the module docstring), noise included: the same noise on both."""
    cfg = _cfg(**over, **{"train.rounds": 1, "train.local_epochs": 1})
    cpu_sim, cpu_metrics = _run(cfg, small_split)
    gpu_sim, gpu_metrics = _run(with_overrides(cfg, {"train.device": "cuda"}), small_split)
    assert gpu_sim.state.q_local.device.type == "cuda"
    _assert_close(_state(gpu_sim), _state(cpu_sim), tol=1e-4)
    _assert_metrics_close(gpu_metrics, cpu_metrics, small_split.n_users)


@needs_gpu
def test_gpu_attacks_agree_with_cpu(tmp_path):
    from attacks import load_observations, load_public
    from attacks.imia import imia
    from attacks.projection import projection

    cfg = {"data": {"synthetic": {"n_users": 30, "n_items": 60}},
           "train": {"rounds": 1, "local_epochs": 1, "dim": 4},
           "record": {"rounds": "last", "clients": 20}}
    api.run(cfg, tmp_path / "r")
    public = load_public(tmp_path / "r")
    obs = load_observations(tmp_path / "r")[0]
    # float64 throughout; the top direction's sign is fixed by the orientation rule
    np.testing.assert_allclose(projection(obs, public, device="cuda"), projection(obs, public),
                               rtol=1e-5, atol=1e-7)
    gpu, cpu = imia(obs, public, device="cuda"), imia(obs, public)
    # float32 shadow training: the same draws, scores within rounding except where a
    # near-tie flips a guess; the shape and the rows left blank are the same
    assert gpu.shape == cpu.shape
    assert np.array_equal(np.isnan(gpu), np.isnan(cpu))
    ok = ~np.isnan(cpu)
    assert np.isfinite(gpu[ok]).all()
    assert np.corrcoef(gpu[ok], cpu[ok])[0, 1] > 0.99
