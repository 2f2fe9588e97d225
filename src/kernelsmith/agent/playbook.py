"""The ``AGENTS.md`` of a workspace: the rules, the contract of ``kernel.py``, and the playbook.

Coding agents (Claude Code, Codex, Cursor...) read ``AGENTS.md`` in the folder they work in. The
text is written for them and for a person: what may be edited (``kernel.py`` only), what a
kernel file may contain (device code, constants, the configs and the launch block) and how to
change its config, what the harness checks and why cheating cannot pay, the loop
(edit -> ``kernelsmith agent bench`` -> KEEP or revert), and the optimizations that usually pay
on NVIDIA GPUs, cheapest first, with a rule for when to stop.
"""

from __future__ import annotations

from dataclasses import dataclass

# The imports a kernel file may have (kernelsmith.evaluate.kernel_file.ALLOWED_IMPORTS; a test
# checks that this sentence names them all).
IMPORTS_TEXT = (
    "the imports `import triton`, `import triton.language as tl` (or `from triton import language as\n"
    "     tl`) and `from __future__ import annotations`, nothing else"
)


@dataclass(frozen=True)
class Facts:
    """What the text says about this workspace's workload and machine."""

    op: str
    summary: str
    workload: str  # spec.describe()
    inputs: str  # "`in0` 8x64:float32, `in1` 64:float32"
    outputs: str
    constants: str
    mode: str  # "gpu" or "interpreter"
    machine: str
    sm_count: int
    bytes_moved: int
    flops: int | None
    start: str  # where kernel.py came from
    tensor_names: tuple[str, ...] = ()  # "in0", ..., "out0", ...: the launch's names for the tensors


RULES = """\
## Rules

1. **Edit only `kernel.py`.** Never edit `workspace.json`, `results.tsv`, `best.py`, this file,
   or anything of the installed kernelsmith package. The harness is not in this folder: `bench`
   reads `kernel.py` as text and evaluates it in a separate, fresh worker process.
2. **`kernel.py` is a kernel file, not a program.** kernelsmith parses it (it never runs it as
   Python) and launches its kernels with its own launcher. Only these top-level statements:
   - a docstring; {imports};
   - `@triton.jit` functions (the device code; helpers too). Inside them: the Triton language
     (`tl.load`, `tl.store`, `tl.sum`, `tl.where`, `.to(...)`, `tl.range`, ...), `if`, `for`
     over `range`/`tl.range`/`tl.static_range`, `while`, assignments to local names. No nested
     functions, lambdas, comprehensions, `with`, `try`, f-strings, names or attributes starting
     with `_`, and no clocks, timers, printing or inline assembly (`tl.extra.cuda.globaltimer`,
     `device_print`, `inline_asm_elementwise`);
   - constants: `NAME = literal` (numbers, strings, booleans, tuples and lists of them), or
     `NAME = tl.constexpr(literal)` for one a kernel body reads;
   - `SPACE = {{"num_warps": [4, 8], "BLOCK": [256, 512]}}`: each parameter of the search and the
     literal list of its values (`num_warps`, `num_stages` and any constexpr you name);
   - `CONSTRAINTS = ["BLOCK <= next_power_of_two(N)", ...]`: conditions a config must meet;
   - `LAUNCH`: how kernelsmith launches the kernel (a dict, or a list of dicts run in order):
     `"kernel"` (a `@triton.jit` function of the file), `"grid"` (1 to 3 expressions),
     `"args"` (the kernel's positional arguments), `"constexprs"` (name -> expression),
     `"num_warps"`, `"num_stages"`, and `"scratch"` for float32 (or other) buffers the launch
     allocates and fills on every call;
   - `CONFIG = {{...}}`: the config `bench` evaluates, one value for every `SPACE` parameter,
     meeting `CONSTRAINTS`. **To try another config, change `CONFIG`**; when you add a
     parameter, add it to `SPACE` (with the values worth searching) and to `CONFIG`.
   No other imports, no classes, no host functions, no loops or calls at top level,
   no `@triton.autotune`/`@triton.heuristics` (kernelsmith tunes), no `try`, no `global`.
   Anything else is rejected before it runs, with one line per problem in `bench`'s reason.
3. **Launch expressions** (the strings in `grid`, `args`, `constexprs`, `num_warps`,
   `CONSTRAINTS`) are a small language kernelsmith evaluates itself: the tensors {tensors}
   (in the op's order; only as a whole argument, or inside `size(t, d)`, `stride(t, d)`,
   `numel(t)`, `row_stride(t)`); `rows` and `N` (the first input's rows, leading dimensions
   flattened, and its row width); `numel`; `num_sms` ({sm_text}); the workload's constants
   {constants}; the config's parameters; the file's constants; `cdiv(a, b)`,
   `next_power_of_two(a)`, `min`, `max`, `abs`; `+ - * // % **`, `/`, comparisons, `and`, `or`,
   `not`, `a if c else b`. Example: `"grid": ["cdiv(rows, ROWS)"]`,
   `"args": ["in0", "out0", "row_stride(in0)", "N", "eps"]`.
4. **Correctness is proved, not sampled.** Outputs are compared with a float64 reference on
   several value distributions (normal, large, tiny, outliers...) with fresh secret seeds, on the
   target shape *and* on tail shapes of the same width (1 row, 7 rows, an odd count), within a
   tolerance derived from PyTorch's own error in the same dtype. Inputs are checksummed, outputs
   pre-filled with varying values before every run (a kernel must write every element and read
   none of them) and re-checked on fresh inputs while timing. Special-casing shapes, seeds or
   values does not pass; the kept kernel is checked again where it serves.
5. **The verdict.** `KEEP` only when the kernel is correct *and* faster than the incumbent (what
   calls run today: the stored winner, else eager PyTorch) with 95% confidence, from timings of
   both interleaved in one process. On `KEEP` the kernel is stored in the database, served from
   then on wherever kernelsmith serves tuned kernels (`@kernelsmith.optimize`, the
   `torch.ops.kernelsmith.kernel` op), and copied to `best.py`. On `REVERT`, restore the best
   version before the next experiment: `cp best.py kernel.py` (or fix the edit, if it was a
   correctness failure you understand).
"""

LOOP = """\
## The loop

```
kernelsmith agent bench                 # in this folder, or: kernelsmith agent bench --dir PATH
```

prints a block of `key: value` lines (grep them) and appends one row to `results.tsv`:

```
correct: yes|no
time_us: ...                 # median of the interleaved rounds
incumbent_us: ...            # the incumbent, timed in the same run
gbps: ...                    # bytes the op must move / time
pct_of_ceiling: ...          # of the measured copy bandwidth of this GPU
speedup_vs_incumbent: ...    # paired median ratio; speedup_ci: its 95% interval
verdict: KEEP|REVERT
reason: ...                  # why, in one line (the failure, or the comparison)
```

One experiment = one idea. Write down in your notes what you tried and the verdict; read
`results.tsv` before choosing the next idea, so no idea is tried twice.
"""

PLAYBOOK = """\
## Playbook: what usually pays, in the order to try it

This op moves {bytes_moved:,} bytes{flops_text}: like most row-wise ops it is bound by memory
bandwidth, so the goal is to stream every byte once at full speed, and `pct_of_ceiling` says how
far there is to go. Cheapest ideas first; each tier assumes the previous one is tuned.

1. **Launch config.** Change `CONFIG` (and widen `SPACE` to record what is worth searching):
   `num_warps` (more warps for wider rows: 1-4 up to 1k elements a program,
   4-8 up to 8k, 16-32 beyond) and `num_stages` (only matters to kernels with a loop: it
   pipelines the next iteration's loads). Re-check it after every structural change.
2. **Block sizes.** Powers of two. A thread should hold 8-32 float32 values: fewer leaves too
   few loads in flight, more than about 64-128 spills registers to local memory.
3. **Rows per program.** For narrow rows (a few hundred to 1k elements) one row is too little
   work for a program: process `ROWS` rows as one 2-D `[ROWS, BLOCK_N]` block, so each program
   moves 16-64 KB.
4. **Persistent scheduling.** A grid of k x {sm_count} programs (`"grid": ["min(rows, 4 * num_sms)"]`),
   each walking rows with a grid-stride loop (`for row in tl.range(pid, n_rows, tl.num_programs(0))`,
   `n_rows` passed as `"rows"`): data shared by all rows (a
   weight) is loaded once per program, program start-up is paid once, and `num_stages` overlaps
   the next row's load with this row's math.
5. **Eviction hints.** `eviction_policy="evict_first"` on data read once (activations),
   `"evict_last"` on data every program re-reads (weights), so L2 keeps what is reused.
6. **Vectorized and TMA loads.** Keep the innermost dimension contiguous and its offsets
   provably aligned (`tl.multiple_of`, `tl.max_contiguous`, row strides divisible by 16) so loads
   become 128-bit; on Hopper (sm_90) tensor descriptors / TMA move 2-D tiles without registers.
7. **Fusing passes.** Read each byte once: keep the row in registers between the reduction and
   the write instead of re-reading it; compute statistics in a single pass (online max/sum,
   Welford) when a row is too wide for registers; one kernel rather than two.

## When to move on

- Three `REVERT`s in a row within one tier: go to the next tier.
- A gain inside the noise (`speedup_ci` straddles 1.0) twice for the same idea: drop the idea.
- `pct_of_ceiling` at 90% or more: the rest is small; stop, or move to another op.
- A correctness failure you cannot explain after two attempts: revert and change approach.
- Across ops, spend time where it pays (Amdahl's law): 1.5x on a kernel taking 60% of the
  time saves more than 3x on one taking 5%.
"""

INTERPRETER = """\
## Interpreter mode

There is no CUDA GPU here: `bench` runs `kernel.py` in the Triton interpreter on the CPU. The
correctness checks are the same as on a GPU, but **interpreter timings are not performance**:
they are host-clock times of the interpreter, and eager PyTorch always wins them. Use this
workspace to get a kernel correct; measure speed on a GPU (`kernelsmith agent init` there).
"""


def agents_md(facts: Facts) -> str:
    """The AGENTS.md text for a workspace."""
    imports = IMPORTS_TEXT
    flops_text = f" and does {facts.flops:,} flops" if facts.flops else ""
    head = f"""\
# kernelsmith workspace: {facts.op}

You are making one GPU kernel faster: **{facts.summary}**, on the workload
`{facts.workload}`, measured on {facts.machine}.

- inputs: {facts.inputs}
- outputs: {facts.outputs}
- constants: {facts.constants or "none"} (name them in launch expressions, such as `"eps"`)
- `kernel.py` started as {facts.start}.

The loop: edit `kernel.py`, run `kernelsmith agent bench`, read the verdict, keep or revert,
repeat.

"""
    sm_text = (
        f"this GPU has **{facts.sm_count} multiprocessors**" if facts.sm_count
        else "the device's multiprocessor count; an H200 has 132"
    )
    tensors = ", ".join(f"`{name}`" for name in facts.tensor_names) or "`in0`, ..., `out0`, ..."
    constants = f"({facts.constants})" if facts.constants else "(none here)"
    text = head + RULES.format(imports=imports, sm_text=sm_text, tensors=tensors, constants=constants)
    text += "\n" + LOOP + "\n" + PLAYBOOK.format(
        bytes_moved=facts.bytes_moved, flops_text=flops_text, sm_count=facts.sm_count or "SM-count"
    )
    if facts.mode == "interpreter":
        text += "\n" + INTERPRETER
    text += """
## Files

| file | what | who writes it |
|---|---|---|
| `kernel.py` | the kernel being optimized | you |
| `best.py` | the last kept kernel (or the starting one) | `bench`, on KEEP |
| `results.tsv` | one row per `bench` run | `bench` |
| `workspace.json` | op, workload, machine fingerprint, incumbent | `init`, `bench` |
| `AGENTS.md` | this file | `init` |
"""
    return text
