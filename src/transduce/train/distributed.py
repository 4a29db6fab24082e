"""This process's place in a training job (Section 5.2: 8 GPUs): torchrun's variables, the process
group, CPU threads, the few collectives the loop needs, every rank's RNG state for exact resume."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch import Tensor

from ..device import resolve_device


@dataclass
class DistEnv:
    """This process's place in a torchrun job (a single process when not launched by torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False
    restart: int = 0  # how many times torchrun restarted the job's workers (--max-restarts)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def say(self, message: str, bar=None) -> None:
        """Print `message` on rank 0 only (through the progress bar `bar`, if there is one)."""
        if self.is_main:
            if bar is not None:
                bar.write(message)
            else:
                print(message, flush=True)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def setup_distributed(device: str = "auto") -> DistEnv:
    """Read the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, ...) and join the process
    group (5.2): NCCL on CUDA, gloo on CPU, on one node or several. `device` is resolved by
    `transduce.device.resolve_device` ("cuda": this process's local rank's GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    owns = world > 1 and not dist.is_initialized()
    if owns:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        store = attempt_store(world, local_world, restart)
        if store is None:
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return DistEnv(rank, world, local_rank, local_world, dev, owns, restart)


def attempt_store(world: int, local_world: int, restart: int) -> dist.Store | None:
    """The store the process group is set up through after a torchrun restart (--max-restarts),
    or None for torchrun's own (the first attempt, or no torchrun).

    torchrun keeps its rendezvous TCPStore, shared with the workers, across restarts: a restarted
    worker can read a dead peer's address from the killed attempt's keys, and the group fails to
    form (gloo: "connectFullMesh failed"; pytorch/pytorch#135712). On one node every worker sees
    the same restart count, so a store prefixed with it gives each attempt keys of its own (across
    nodes: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, docs/cluster.md)."""
    if restart == 0 or local_world != world or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=default_pg_timeout
    )
    return dist.PrefixStore(f"transduce/attempt_{restart}", store)


def set_threads(env: DistEnv, threads: int | None) -> None:
    """CPU threads: as asked, else OMP_NUM_THREADS if set (torchrun sets it to 1 for several
    processes), else the available cores shared among this machine's processes."""
    if threads:
        torch.set_num_threads(threads)
    elif env.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // env.local_world_size))


def all_reduce_(t: Tensor, env: DistEnv, op=None) -> Tensor:
    if env.distributed:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def agree(env: DistEnv, flags: list[bool]) -> list[bool]:
    """Rank 0's flags, on every rank (the other ranks contribute False)."""
    t = torch.tensor([float(f and env.is_main) for f in flags], device=env.device)
    return [bool(x) for x in all_reduce_(t, env, dist.ReduceOp.MAX).tolist()]


def any_rank(env: DistEnv, flag: bool) -> bool:
    """Whether `flag` is true on any rank (one all-reduce with several processes)."""
    if not env.distributed:
        return flag
    t = torch.tensor([float(flag)], device=env.device)
    return bool(all_reduce_(t, env, dist.ReduceOp.MAX).item())


# --- RNG state (exact resume) ---------------------------------------------------------------------


def gather_rng_states(env: DistEnv) -> dict[str, Tensor]:
    """Every rank's torch RNG states, {"cpu/rank{r}": uint8, "cuda/rank{r}": uint8} (a
    collective: every rank must call it). Dropout draws from these."""
    states = {"cpu": torch.get_rng_state()}
    if env.device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(env.device)
    if not env.distributed:
        return {f"{k}/rank0": v for k, v in states.items()}
    out = {}
    for kind, state in states.items():
        t = state.to(env.device)
        gathered = [torch.empty_like(t) for _ in range(env.world_size)]
        dist.all_gather(gathered, t)
        out.update({f"{kind}/rank{r}": g.cpu() for r, g in enumerate(gathered)})
    return out


def restore_rng_states(rng: dict[str, Tensor], env: DistEnv) -> bool:
    """Set this rank's RNG states from a checkpoint; False if it holds none for this rank."""
    cpu = rng.get(f"cpu/rank{env.rank}")
    if cpu is None:
        return False
    torch.set_rng_state(cpu)
    cuda = rng.get(f"cuda/rank{env.rank}")
    if cuda is not None and env.device.type == "cuda":
        torch.cuda.set_rng_state(cuda, env.device)
    return True


def seed_dropout(seed: int, rank: int) -> None:
    """A different dropout stream per rank (the model's initialisation used `seed` itself)."""
    torch.manual_seed(seed * 1000 + 1 + rank)
