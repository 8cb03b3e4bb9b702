"""How PyTorch's OpenMP threads wait between parallel regions on a CPU, decided before torch loads its OpenMP runtime.

PyTorch's CPU wheels use GNU OpenMP (libgomp), which reads its variables once, when it loads: `import sdar` sets them
(`sdar/__init__.py`), so a process that imported torch before sdar keeps what its environment said. A thread that
finishes its share of an op waits for the next one, spinning or asleep:
- libgomp's default spins up to 300,000 times at every barrier. Alone on the cores that is the fastest, but two
  processes sharing them spin away each other's time slices: two SmolLM2 steps at once took 180-400 s each against
  35-50 s asleep (2 cores, measured by hand at 35c940c; why sdar has never used the default).
- `OMP_WAIT_POLICY=PASSIVE` (sdar's setting until this module) sleeps at once. Shared cores lose nothing, but a
  process alone wakes its threads for every op of tens of thousands a step.
- `GOMP_SPINCOUNT=1000` (sdar's setting now) spins briefly, then sleeps: most of the default's speed alone and little
  of its cost when shared. benchmarks/bench_omp_wait.py measures the three side by side (docs/benchmarks.md).

A user's own `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` wins (set either to PASSIVE / 0 on a machine shared with other
jobs). The local pipeline, which trains two arms at once, gives its tasks PASSIVE (`at_once`). The test suite runs
PASSIVE (tests/conftest.py): its workers share the cores by design. Multi-rank launches are untouched by this:
torchrun gives each rank one thread (OMP_NUM_THREADS=1) unless told otherwise. Intel's OpenMP runtime (other builds)
has its own knob, KMP_BLOCKTIME, which this leaves alone."""

from __future__ import annotations

from collections.abc import Mapping

# libgomp's spins at a barrier before its thread sleeps: SmolLM2's step on 2 cores alone was as fast with 1,000 as
# with the default 300,000 (and slower with 300: its threads slept between ops again), and two processes sharing the
# cores lost about 10% against sleeping at once (3,000: 35%; 30,000: 4-5x)
SPIN_COUNT = 1000
KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# whether this process's environment named either knob when `import sdar` ran (`apply`): then it is left alone everywhere
USER_CHOSE = False


def apply(environ) -> None:
    """What `import sdar` does: note whether the user chose (`USER_CHOSE`), and add `wait_settings`."""
    global USER_CHOSE
    settings = wait_settings(environ)
    USER_CHOSE = not settings
    environ.update(settings)


def at_once(processes: int) -> dict[str, str | None]:
    """The variables for child processes that train `processes` at once on these cores (the local pipeline's arms):
    asleep at once (PASSIVE, and sdar's spin count removed: libgomp lets GOMP_SPINCOUNT override the policy) when
    more than one runs and the user chose nothing; else none. None: remove the variable. Two SmolLM2 trainings at
    once ran 1.28x slower each with the short spin than asleep at b0deec7 (1.12x before; docs/benchmarks.md,
    omp-wait)."""
    if processes <= 1 or USER_CHOSE:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}


def wait_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` before torch loads: none when it sets either of `KNOBS` (the user's choice),
    else a short spin (`SPIN_COUNT`)."""
    if any(k in environ for k in KNOBS):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


def describe(environ: Mapping[str, str]) -> str:
    """What a process started with `environ` waits with once `import sdar` ran: 'passive', 'active', 'spin N' or
    'libgomp default' (what a benchmark's stamp names)."""
    env = {**environ, **wait_settings(environ)}
    if env.get("GOMP_SPINCOUNT", "").strip():  # libgomp: a spin count overrides the policy
        return f"spin {env['GOMP_SPINCOUNT'].strip()}"
    policy = env.get("OMP_WAIT_POLICY", "").strip().lower()
    if policy in ("passive", "active"):
        return policy
    return "libgomp default"
