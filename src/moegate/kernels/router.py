"""The fused Triton router: launch heuristic, launcher, torch.library custom op, ``route_triton``.

The kernel body lives in ``router_kernel.py``. Read top to bottom: limits, the launch heuristic, the
launcher that writes into preallocated outputs, the custom op (so that torch.compile traces one opaque
call with a fake implementation), and the public function that ``moegate.route(backend="triton")``
calls after validating its arguments.
"""

import contextlib
import functools
import os
from typing import NamedTuple

import torch
import triton

from moegate._checks import _check_hash_table, _check_no_aliasing, _needs_grad
from moegate.config import RouterConfig
from moegate.kernels import router_kernel as rk
from moegate.kernels import warp_rows_kernel as wrk
from moegate.layout import ExpertLayout
from moegate.reference import shared_weight

# What one launch can take. The tile of a row lives in registers, [groups, experts per group] padded
# to powers of two; past MAX_TILE lanes a row no longer fits the 16 warps a program may use.
MAX_TILE = 16384
MAX_TOP_K = 64  # the selection loop is unrolled K times
MAX_SHARED_COLUMNS = 64
MAX_REPLICAS = 64  # the home_rank policy unrolls over the replicas of an expert
MAX_PACKED_ID = 32767  # packed words hold id << 16 in an int32

# (block_m, num_warps) forced by the benchmark's sweep; None means the heuristic below.
launch_override: tuple[int, int] | None = None
# Forced by the tests and the benchmark's A/B: weights from the tile (True) or from the gather (False);
# None means the heuristic below. use_pdl_override likewise (None: PDL on sm_90+ up to PDL_MAX_TOKENS).
tile_weights_override: bool | None = None
use_pdl_override: bool | None = None
# Forced by the tests: sigmoid or sqrt-softplus selection keys from fast math with checked margins (True), exact keys
# (False), or the heuristic (None); force_exact sends every row down the exact 64-bit path.
approx_keys_override: bool | None = None
# H200 runs 6 and 9 (BENCHMARKS.md), fast vs exact keys: 896 experts faster (T=65536: 351 vs 409 us), every
# narrower tile level or slower (run 9, T=65536: DeepSeek-V3 fp32 62.8 vs 63.1, 512 top-22 144 vs 115 with
# 101 registers; T=4096: DeepSeek-V3 7.8 vs 6.0): those rows are bound by integer ALU work the keys do not
# touch, and rows that fail the margin checks make one-wave launches wait for an exact-path row.
APPROX_KEYS_MIN_LANES = 1024
# ... and only for one row or large launches. A row whose margins fail reruns steps 2-5 on exact keys, and
# a launch of one wave waits for it: H200 run 10, 896 top-16, fast vs exact keys: T=1 3.80 vs 4.71 us,
# T=16 9.32 vs 4.79, T=256 9.72 vs 5.16, T=4096 28.65 vs 27.89, T=65536 351 vs 408; T=8192 49.2 (run 10,
# fast) vs 53.5 (run 12, exact).
# 256- and 512-lane rows (DeepSeek-V3, Kimi-K2) take them too at large T, held to 64 registers (one-warp programs
# keep their 32 warps an SM) where the distance words are exact (not 512 lanes top-22: 124 vs 115 us at T=65536;
# H100 run 143 on the kernel of 2026-12-06, 23% fewer instructions a row: 78.1 vs 79.1 at T=65536, 44.6 vs 45.4 at
# 32768, 27.3 vs 26.2 at 16384, 1.9-2.5x slower at T <= 1024; its rows are bound by ALU-pipe work the keys keep).
# H200 run 44 (BENCHMARKS.md), fast keys capped at 64 against exact keys: T=65536 DeepSeek-V3 fp32 58.5 vs 60.4 us,
# bf16 54.6 vs 57.7, Kimi-K2 59.6 vs 64.4; T=32768 30.8 vs 31.2, 29.4 vs 29.8, 32.8 vs 33.5; slower at T=16384
# (17.2 vs 16.5, 16.9 vs 16.0; Kimi-K2 17.1 vs 17.4) and T=8192 (10.4 vs 9.4).
APPROX_KEYS_NARROW_MIN_LANES = 256
# Run 50, with the exact keys in their FMA forms (FMA_KEYS) since: T=32768 exact ahead (DeepSeek-V3 fp32 30.19 vs 31.25,
# bf16 28.95 vs 29.54, Kimi-K2 32.01 vs 33.30), T=65536 the fast keys (58.52 vs 58.70, 54.80 vs 56.02, 59.46 vs 60.99).
# Run 72, the one-row path on the row's logit sum and raw key bits (DEAD_BY_ROW, RAW_BITS), fast / FMA keys: T=32768
# DeepSeek-V3 fp32 25.72 / 25.40, bf16 24.76 / 24.88, Kimi-K2 (512 lanes) 26.18 / 27.41, 896 top-16 (1024 lanes)
# 150.4 / 153.6; T=8192 896 top-16 42.19 / 39.56, Kimi-K2 9.08 / 8.06; T=65536 fast ahead on all four. Fast keys
# from T * lanes >= APPROX_KEYS_MIN_LANE_ROWS: 256 lanes from T = 65536, 512 from 32768, 1024 from 16384.
APPROX_KEYS_MIN_LANE_ROWS = 1 << 24
APPROX_KEYS_MAX_REGISTERS = 64
# Sqrt-softplus keys (DeepSeek-V4: 256 experts, top-6, + bias) from ex2 / lg2 / sqrt approx with checked
# margins, H200 run 25 (BENCHMARKS.md), fast vs exact keys: T=65536 54.0 vs 62.1 us, T=32768 28.1 vs 32.2, T=1
# 2.43 vs 2.64; slower where a launch is about one wave and waits for its rows on the exact path: T=1024 4.17
# vs 3.07, T=4096 6.52 vs 5.77, T=8192 9.87 vs 9.61 (run 26: 9.44 vs 9.88; T=16384 14.89 vs 17.62). Runs 44-45
# on today's kernel: T=8192 9.11 vs 9.41 and 9.20 vs 9.43 (faster now), T=4096 5.83 vs 5.56, T=1024 3.84 vs 2.84.
# Small launches take them too, where few rows risk the exact path: run 58, the same launches fast / exact keys (the
# fast ones with BIAS_EARLY): T=16 1.83 vs 2.07 us, T=64 1.85 vs 2.09, T=256 2.04 vs 2.25, T=1024 3.89 vs 2.97 (rows
# redone). A redone row costs its launch ~1 us; at 0.22% of rows redone (the benchmark's draws, run 33) a launch of
# T rows redoes one with probability 1 - 0.9978**T: 7% at T = 32 (~0.08 us expected against ~0.24 saved), 43% at
# 256 (~0.5 us against ~0.2), so up to APPROX_SSP_SMALL_MAX_TOKENS only.
APPROX_SSP_KEYS = True
APPROX_SSP_MIN_TOKENS = 8192
APPROX_SSP_SMALL_MAX_TOKENS = 32
# Fast keys with the repair of close winners (_approx_repair: the K + 2 best fast words reordered on exact
# keys read back, where the row was redone whole): forced on or off (tests, A/B), or the default: with
# APPROX_REPAIR, fast keys at every T for rows without groups and the repair below APPROX_REPAIR_MAX_TOKENS.
# Off by default: H200 run 28 (BENCHMARKS.md), fast keys with the repair / redone / exact
# keys, us: DeepSeek-V4 T=16 2.94 / 2.77 / 2.86, T=1024 3.58 / 4.14 / 3.32, T=4096 6.10 / 6.35 / 5.89,
# T=8192 9.51 / 9.84 / 9.85; 896 top-16 T=16 5.37 / 9.09 / 4.57, T=256 5.48 / 9.44 / 5.05, T=1024 10.03 /
# 11.92 / 10.37, T=4096 30.35 / 28.58 / 27.66, T=8192 56.26 / 49.79 / 52.90. The repair saves the rows
# that were redone, but its extra round (K + 2 words) and registers (DeepSeek-V4: 72 against 64) cost every
# row about what the exact keys save.
approx_repair_override: bool | None = None
APPROX_REPAIR = False
APPROX_REPAIR_MAX_TOKENS = 16384
# Exact sigmoid / sqrt-softplus keys in their FMA forms (FMA_KEYS: router_kernel._recip_ge1 and _sqrt_fma, the bits
# of div_rn and sqrt_rn without their range checks and branches; rows with a finite logit below -87 / -69 redo their
# keys exactly): forced on or off (tests, the benchmark's A/B), or the default, FMA_KEYS, for rows on warps with exact
# keys. H200 run 50 (BENCHMARKS.md), FMA / div_rn keys, us: DeepSeek-V3 fp32 T=16 2.16 / 2.34, T=4096 5.42 / 5.66,
# T=16384 16.48 / 16.78; bf16 T=16384 15.58 / 16.33; Kimi-K2 T=8192 9.37 / 10.08; 896 top-16 T=16 3.76 / 4.46; but
# one-warp rows with shifted distance words (512 lanes top-22: 82 registers against 72) slower from T = 8192 (17.53 /
# 16.80, T=16384 36.21 / 35.49; T=4096 9.71 / 9.87). Run 72, on the one-row path since (DEAD_BY_ROW, 78 registers): FMA
# keys ahead there too (T=8192 14.24 / 15.67, T=32768 56.22 / 60.66, T=65536 99.35 / 107.95), so every T takes them.
# Sqrt-softplus keys (DeepSeek-V4, whose fast keys take T <= 32 and T >= 8192): run 51 had the FMA square root
# slower at T = 16-256 on the kernel of then (T=16 2.33 / 2.20 us, T=256 2.42 / 2.34, T=4096 5.53 / 5.69), and the
# launcher took it from T = 4096 only; run 79 on today's kernel, FMA / sqrt_rn keys: T=64 1.67 / 1.92, T=128 1.77 /
# 2.01, T=256 1.83 / 2.08, T=1024 2.43 / 2.65, T=2048 3.24 / 3.60, T=4096 5.26 / 5.42. So every T between the fast
# keys takes them, as the sigmoid keys do.
fma_keys_override: bool | None = None
FMA_KEYS = True
# Forced by the tests: renormalized softmax selected on the logits where the launcher allows it (None or
# True) or never (False).
logit_keys_override: bool | None = None
force_exact_override: bool = False
# Diagnostics (the benchmark's --fallbacks): an int32 [3] device tensor that the launches add to: programs
# that left the fast path and redid their rows, programs that repaired a row (_approx_repair), programs.
# None (the default): nothing counted, nothing compiled in.
count_fallbacks_into: torch.Tensor | None = None
# Narrow rows without groups or hashing, one row a thread (THREAD_ROWS): forced on (True) for any width the
# tests pick, off (False), or the heuristic (None): rows of at most THREAD_ROWS_MAX_LANES experts. H200 run
# 14, one row a thread against rows on warps: Mixtral (8 experts, top-2) T=4096 1.61 vs 2.30 us, T=65536
# 3.68 vs 5.78; 16 experts top-2 T=4096 2.48 vs 2.08, T=65536 5.44 vs 5.05; 32 top-8 slower everywhere
# (T=65536 20.0 vs 15.5: a thread's E * K compare chain grows past what it saves). Run 20, with the logit
# keys one row a thread gained since: 16 top-2 mixed, 32 top-8 still slower (19.3 vs 15.4).
thread_rows_override: bool | None = None
THREAD_ROWS_MAX_LANES = 8
THREAD_ROWS_MAX_FORCED = 32  # the kernel's tree of pairs takes up to 32 lanes
# Rows without groups or hashing on Q threads each (SPLIT_ROWS, _split_rows): forced to Q (the tests, the
# benchmark's A/B), off (0), or the heuristic (None). H200 run 21 (BENCHMARKS.md), Qwen3 (128 experts, top-8,
# renormalized softmax selected on the logits), split against the rows on warps: T=65536 21.4 us on 8 threads
# a row (22.5 on 4, 24.8 on 16) against 36.8, T=32768 12.2 against 21.2, T=4096 4.73 on 16 threads (5.55 on
# 8) against 5.42; T <= 1024 slower on any Q (2.0-2.5 against 1.5-2.2 us). DeepSeek-V4 (sqrt-softplus + bias,
# 256 experts) and Kimi-K2 (sigmoid + bias, 384) slower split (T=65536: 71.7 and 83.2 against 62.2 and 64.9):
# their keys' math is the same work a column on any layout, and their weights need the gather.
split_rows_override: int | None = None
SPLIT_THREADS = (2, 4, 8, 16)  # a program of w warps takes 32 * w / Q rows: at least 2
SPLIT_MAX_COLUMNS = 32  # columns a thread: _fold's tree takes up to 32
SPLIT_MIN_TOKENS = 4096
# Run 22 (revised split rows), 16 against 8 threads a row: T=4096 4.52 vs 5.64 us, T=8192 6.38 vs 6.88,
# T=16384 8.08 vs 8.30, T=65536 22.45 vs 19.23 (run 21, T=32768: 13.34 vs 12.21). Run 24's GPU suite passed 8
# threads a row at T = 4096, 32768 and 65536 (test_split_rows_at_large_T_match_reference). Run 46 on today's kernel,
# Qwen3 on 8 / 16 threads a row: T=8192 4.40 vs 4.82 us (8 on two warps 4.41), T=4096 3.75 vs 3.49.
SPLIT_WIDE_TOKENS: int | None = 8192  # from here 8 threads a row, below 16
# Split rows with logit keys whose programs fall back settle their close rows on exact scores first (the K winners'
# scores ranked by score and id, _split_settle_pairs) and take the 64-bit rounds only for what that cannot decide:
# forced on or off (tests, the benchmark's A/B), or the default, SPLIT_PAIR_EXACT. Run 38 (BENCHMARKS.md) found one
# program of 2048 on the 64-bit rounds costing Qwen3 at T = 4096 1 us of 4.3; run 39's A/B, Qwen3 without / with:
# T=4096 4.40 / 3.44 us, 8192 5.90 / 5.27, 16384 7.72 / 7.34, 32768 11.47 / 10.03, 65536 19.00 / 18.65.
split_pair_exact_override: bool | None = None
SPLIT_PAIR_EXACT = True
# A register cap for ptxas: forced by the benchmark's A/B (--ab-variants maxnreg-N; 0: none, ptxas decides) or the
# default, _register_cap. Where a launch's register count is set by its rarely taken exact path
# (scripts/sass_count.py: DeepSeek-V4 at T >= 16384 takes 64 registers, 36 without that path; 896 experts 72
# against 40), a cap spills there and not on the fast path, for more warps an SM. H200 run 44 (BENCHMARKS.md), 896
# experts top-16 (4 warps a row) capped at 56 / 48 / uncapped: T=8192 47.2 / 49.1 / 49.4 us, 16384 87.3 / 91.7 /
# 93.8, 32768 166.5 / 174.6 / 180.0, 65536 323.7 / 338.6 / 350.9; one-warp rows slower under a cap (512 top-22
# T=65536 116.7 at 56, 120.3 at 48, against 115.1; Qwen3's split rows 17.2 / 17.9 against 16.7). Run 45, 896
# experts capped at 56 / 64 / uncapped: T=1024 8.27 / 7.43 / 9.92, T=4096 24.55 / 24.98 / 27.65, T <= 256 level
# (T=1 3.71 / 3.60 / 3.56, T=256 4.88 / 4.83 / 4.84).
maxnreg_override: int | None = None
WIDE_ROW_MAX_REGISTERS = 56  # rows of 2048 lanes and more, one a program of several warps, T > 2048
WIDE_ROW_MID_MAX_REGISTERS = 64  # ... 256 < T <= 2048 (none below)
# One warp on a row of 1024 lanes (the launcher's choice since run 126; with the 32-bit exact rounds): 32 lanes a thread
# take 145 registers uncapped (13 warps an SM), 123 under this cap with nothing spilled (16); the 64 of narrower
# one-warp fast-key rows spilled 314 bytes a thread there (sm_90 SASS, 896 top-16, T = 65536).
WIDE_ONE_WARP_MAX_REGISTERS = 128
# ... and from T = 16384, where a launch is many waves and more warps an SM pay: 80 registers (25 warps an SM against
# 16; sm_90 SASS at T = 65536: 73 bytes a thread spilled for 896 top-16, 59 for LongCat-Flash, on the exact path's
# side). H100 run 131 (BENCHMARKS.md), 896 top-16 under caps of 80 / 96 / 128: T = 65536 123.0 / 125.2 / 131.9 us,
# 32768 68.4 / 68.6 / 71.3; level at 16384 (41.1 / 40.3 / 40.9), slower at 4096 (18.1 / 18.1 / 16.5).
WIDE_ONE_WARP_LARGE_MAX_REGISTERS = 80
WIDE_ONE_WARP_LARGE_MIN_TOKENS = 16384
# One warp on a row of 257-512 lanes with shifted distance words or logit keys (512 top-22; Qwen3-Next, renormalized
# softmax of 512) from T = 16384: 79-85 registers uncapped (24-25 warps an SM), 64 under this cap with nothing spilled
# (32 warps, the limit of one-warp programs); the rows on exact distance words (Kimi-K2: 63-64) and those on fast
# keys (capped at 64 already) are left as they were. H100 run 131, 512 top-22
# capped at 64 / uncapped: T = 65536 92.3 / 96.9 us, 32768 47.9 / 50.0, 16384 28.5 / 29.0, 4096 11.70 / 11.71.
MID_ONE_WARP_MAX_REGISTERS = 64
MID_ONE_WARP_MIN_TOKENS = 16384
# Split rows on 8 threads in one-warp programs (Qwen3 at T = 8192-16383): 72 registers (28 warps an SM), 64 under the
# cap with no spill (32 warps, the one-warp limit). H200, the same launches capped / uncapped: run 49 T=8192 4.31 vs
# 4.49 us; run 53 T=8192 4.34 vs 4.38, T=12288 4.88 vs 5.01. Two-warp split rows (from T = 16384) took 64 uncapped
# until the exact path's softmax flush (contract step 2; 2026-12-04), which took them to 93 (20 warps an SM) and
# Qwen3 at T = 65536 from 18.05 to 20.53 us (H200 run 121); capped at 64 they spill nothing and keep 32 warps.
SPLIT_MAX_REGISTERS = 64
# Weights from the tile only where a thread holds one lane of it (Mixtral's 8 experts, 4 rows a warp):
# H200 run 4 (BENCHMARKS.md), T=1: Mixtral 1.77 us from the tile vs 2.09 from the gather, but every
# wider row slower from the tile (DeepSeek-V3 3.36 vs 2.19, Kimi-K2 4.56 vs 2.47, 896 experts 5.73 vs
# 4.49): the tile's epilogue works on every lane, the gather on K of them. Large launches are bound by
# instructions and keep the gather too.
TILE_WEIGHTS_MAX_TOKENS = 2048
TILE_WEIGHTS_MAX_LANES_PER_THREAD = 1
# Programmatic dependent launch measured 0.3-0.65 us faster at T=1 and 0.0-0.3 us at T=4096 (run 4's A/B).
# Past that it is left off for rows on warps: H200 run 44 (BENCHMARKS.md), PDL on against off, one row a program:
# DeepSeek-V3 fp32 T=8192 10.34 vs 9.44 us, T=65536 79.3 vs 60.4 (every 256-lane shape alike); 512 and 1024 lanes
# level (115 vs 115 at T=65536). One row a thread gains from it up to PDL_THREAD_MAX_TOKENS (Mixtral T=8192 1.37
# vs 1.79 us, 16384 1.82 vs 2.00, 32768 level, 65536 2.57 vs 2.38). Split rows take it on two-warp programs (from
# T = 16384: Qwen3 16384 6.28 vs 6.78, 32768 9.23 vs 9.38, 65536 16.51 vs 16.71) and not on one warp (run 45:
# T=4096 4.00 vs 3.63, T=8192 5.33 vs 4.80).
PDL_MAX_TOKENS = 4096
PDL_THREAD_MAX_TOKENS = 16384
# Where a PDL launch lets the next grid start (the kernel's PDL_TRIGGER): 0 at its start, 1 after the selection
# (before the epilogue's stores), 2 never (the next grid launches when this one ends); forced by the benchmark's
# A/B (pdl_trigger_override). H200 runs 30-31 (BENCHMARKS.md), after the selection against at the start, one row a
# program: 0.1-0.25 us faster at T = 16-512 on every 256- and 512-lane shape (DeepSeek-V3 fp32 T=64 2.44 vs
# 2.60, DeepSeek-V4 T=256 2.58 vs 2.76), level at T = 1024, slower from T = 2048 on the 256-lane shapes
# (DeepSeek-V3 T=4096 7.79 vs 6.00); one row a thread (Mixtral) level or 0.05 us slower: at the start there.
PDL_LATE_MAX_TOKENS = 512
pdl_trigger_override: int | None = None
# ptxas issues the bias load of sqrt-softplus rows on warps after their scoring (sm_90 SASS, DeepSeek-V4: after
# ~360 instructions at T = 16), so a small launch, whose one warp on an SM sub-partition has nothing to hide it
# behind, waits for a second L2 round trip. BIAS_EARLY pins it before the scoring (the kernel's comment says how);
# sigmoid rows already load their bias with the logits. H200 run 53 (BENCHMARKS.md), DeepSeek-V4 pinned / not: T=1
# (fast keys: MUFU ops right before the bias add) 1.75 vs 1.89 us; on the exact keys, whose IEEE square roots cover
# the load, level or slower (T=16 2.05 vs 2.04, 64 2.10 vs 2.06, 1024 2.89 vs 2.85, 4096 5.46 vs 5.34). Forced on
# or off where a row on warps has a bias (bias_early_override: the tests, the benchmark's A/B), or the default:
# fast sqrt-softplus keys up to BIAS_EARLY_MAX_TOKENS (they run at T <= 32 there). Since the keys take the unmasked
# logits (router_kernel._load_tile_raw), ptxas issues that load early by itself (sm_90 SASS, T = 1: four 128-bit
# loads before the first MUFU op with the pin and without); the pin stays, one select, against ptxas changing its mind.
BIAS_EARLY_MAX_TOKENS = 1024
bias_early_override: bool | None = None
# One row a thread with logit keys (Mixtral): each round's winner takes its logit from the thread's own columns
# (E - 1 selects) instead of a load that waits on the selection (an L1 hit at best). Forced on or off by
# winners_in_regs_override (the tests, the benchmark's A/B: --ab-variants winners-in-regs,winners-reloaded).
THREAD_WINNERS_IN_REGS = True
winners_in_regs_override: bool | None = None
# One row a one-warp program: the round words' checks (strictly decreasing winners, the clamp, the fast keys'
# margins) run on each round's scalar as it comes, and the row's own flags (fast / FMA key band, dead lanes, raw-bit
# rows) go into its first word, instead of vector checks and reductions after the rounds: a shorter chain for
# launches whose one warp an SM waits on every step (sass_count.py --cycles: DeepSeek-V3 T=1 2013 -> 1874 cycles),
# ~9 more instructions a column where launches are bound by issue. H200 run 75 (BENCHMARKS.md), scalar / vector:
# DeepSeek-V3 fp32 T=1 1.55 / 1.60 us, T=256 1.83 / 1.89, T=1024 2.41 / 2.46; Kimi-K2 T=16 1.63 / 1.74; DeepSeek-V4
# T=256 2.08 / 2.16; 512 top-22 T=256 2.83 / 2.93 but T=1024 3.69 / 3.62, T=4096 9.39 / 8.48. Where T * K is at most
# SCALAR_CHECKS_MAX_TOKEN_COLUMNS (the kernel's SCALAR_CHECKS). Not for logit keys (Qwen3 T=16 1.42 / 1.36: their
# margin is a longer float expression a column) nor several warps a row (896 top-16 T=256 4.23 / 3.94). Forced on or
# off by the override where a one-row program can take it (tests, the benchmark's A/B).
SCALAR_CHECKS_MAX_TOKEN_COLUMNS = 8192
scalar_checks_override: bool | None = None
# One row a program whose groups are dropped in the words (exclusion, kept groups by counting, a group the tile's
# own width): after step 4 the kept groups' logits and bias are read again (L1 hits) and their keys recomputed in a
# tile of TOPK_GROUP groups, packed by rank, and the rounds run on that tile only (the kernel's KEPT_ONLY).
# DeepSeek-V3: half the lanes a round, no select for the dropped ones; sm_90 SASS on fast keys (T = 65536) 496
# fast-path instructions a row against 522, bf16 480 against 502; H200 run 90 (BENCHMARKS.md): 43.29 against 43.88 us
# fp32, 41.93 against 42.32 bf16, and 0.1-0.7 us slower on FMA keys, so on fast keys only by default.
# kept_only_override forces it on or off where a launch can take it, FMA keys included (tests, the benchmark's A/B:
# --ab-variants kept-only,all-lanes).
KEPT_ONLY = True
kept_only_override: bool | None = None
# One row a program on the fast or FMA keys finds a row's dead lanes (NaN, +-inf logits) by the NaN key they leave at
# the top of its key bits (the kernel's NAN_DEAD; one FMA a lane), not by the row's logit sum: forced off (tests, the
# benchmark's A/B: --ab-variants row-sum-dead) or the default (None: on).
nan_dead_override: bool | None = None
# The exact path's rounds on 32-bit values, two maxes a round (the kernel's EXACT32, _exact_rounds32), instead of one
# 64-bit max: for one warp on a row of 1024 lanes and more, where the 64-bit rounds returned lanes past the tile on
# the H200 (runs 7-8). The launcher puts a 1024-lane row on one warp since run 126 (four warps before): 32 lanes a
# thread, 1260 fast-path instructions a 896-top-16 row in sm_90 SASS (123 registers under the cap, none spilled)
# against 4 x 713 on four warps; --ab-variants four-warps-wide times the old launch. exact32_override forces it on
# or off anywhere (tests; off refuses one warp on 1024+ lanes, and the launcher then takes four warps).
exact32_override: bool | None = None
# One row a one-warp program asks the L2 for the row PREFETCH_ROWS programs ahead (the kernel's PREFETCH_ROWS, a PTX
# prefetch a line a thread): programs start in about their order, so that row's own read then waits on the L2 rather
# than HBM. For rows of at most 4 KB with unit column stride; 0 turns it off. prefetch_rows_override forces the
# distance (tests, the benchmark's A/B: --ab-variants prefetch-N); None: PREFETCH_ROWS from PREFETCH_MIN_TOKENS.
# Off: run 127 (H100, T >= 32768) timed it within -2% / +1.4% at 1024 rows ahead and slower further ahead.
PREFETCH_ROWS = 0
PREFETCH_MIN_TOKENS = 16384
prefetch_rows_override: int | None = None
# Arguments that the launch's constexprs turn off (absent tensors and their strides, unused scalars) are passed as
# None, so that Triton leaves them out of the kernel's parameters: a launch without padding, placement or capture
# then carries 8-10 parameters (52-64 bytes) instead of 34 (200). H200 runs 61 and 64 (BENCHMARKS.md) timed it level
# with every argument at T = 1-32768. lean_params_override forces it (False: every argument, as before).
LEAN_PARAMS = True
lean_params_override: bool | None = None
# Distance words drop low ulp bits from 1024 lanes up (896 experts: 25% of rows on the exact path without,
# 0.1% with; run 4: 532 -> 443 us at T=65536), and at 512 lanes for K >= 16, where the K-th winner sits
# far below the best (512 top-22, run 4: the exact-path spikes of run 3 gone, 10.45 -> 4.38 us at T=64,
# 17.5 -> 14.2 at T=4096). The shift costs an extra round, 1/K of the selection: Kimi-K2 (512 lanes,
# top-8) measured 12-20% slower with it, so it keeps the exact distance. Keys that are fp32 logits (renormalized softmax
# on logit keys, selection on the logits) spread wider than sigmoid scores: their words span 2**LOGIT_SPAN_LOG2
# binades below the best logit at every width (DIST_SHIFT = lane bits - 8 + LOGIT_SPAN_LOG2). One binade (the span
# of 256 unshifted lanes, and of 512 lanes one bit shifted) left the K-th winner of N(0, 1) rows below half the best
# in 2.6% of rows at 256 lanes top-8 (Qwen3.5), 1.0% at 512 top-10 (Qwen3-Next; 11 of 1024 rows redone under the
# interpreter), each redone on the exact path: H200 run 133 timed Qwen3-Next fp32 at 3.78 us for T = 64 against
# 2.06 at T = 1 (a launch of 64 rows then holds such a row about half the time). Two binades: none of 200,000 rows
# at 256-1024 lanes top-10. Logits that are bf16 / fp16 values take no shift at any width (their exact ties would
# then share a distance and flag their rows; their words span every value: see KEY_SHIFT in _launch).
# logit_span_override forces the span (0: one binade, as before; tests, --ab-variants logit-span-0).
DIST_SHIFT_MIN_LANE_BITS = 10
DIST_SHIFT_512_MIN_K = 16
LOGIT_SPAN_LOG2 = 1
logit_span_override: int | None = None
# Rounds on cached words (the kernel's CACHE_DEPTH): one row a program of CACHE_MIN_LANES lanes or more and top-k of
# CACHE_MIN_K or more first finds the top CACHE_DEPTH words of each of 32 lane groups (CACHE_VEC adjacent lanes a
# block, 16 bytes of logits: a thread's own lanes where the words keep the loads' layout), then runs each round on the
# 32 heads.
# Depth 5 up to top-12 (a group that runs out before the last round sends the row to the exact path); beyond top-12,
# 7 below T = CACHE_DEEP_MAX_TOKENS and 6 from it: a launch of a wave or two waits for any row the exact path redoes,
# and depth 6 redoes ~0.26% of random 512 top-22 rows (32 groups, P(Poisson(22 / 32) >= 6) each), depth 7 ~0.025%.
# H100 run 141 (one call, A/B of depths 0/6/7/8 at T = 64-65536): 512 top-22 under depth 7 0.83-0.95x depth 6 at
# T = 256-8192 (T = 1024 5.10 against 6.14 us, 4096 10.97 against 12.58), level at 16384, 1.05x at 65536; 896
# top-16 0.97-0.99x at T = 256-8192, 1.02x at 16384; depth 8 within 2% of 7 below 16384, slower from it. Qwen3-Next
# (top-10) and LongCat-Flash (top-12) gain nothing from 6 or 7 over 5 at T = 256-16384.
# H200 run 133, one call, A/B of depths 0/4/5/6 at T = 1 to 65536: 896 top-16 under depth 6 0.81x the plain rounds
# at T = 65536, 0.85x at 16384, 0.89x at 1 (4: 1.21x, too many rows on the exact path); 512 top-22 (6) 0.86x / 0.92x
# at 65536 / 16384, 1.08x at 4096; Qwen3-Next fp32 (5) 0.95-0.98x at every T; Kimi-K2 (5) level; LongCat-Flash (5)
# 0.86-0.93x. cache_rounds_override forces a depth (0: the plain rounds; tests, --ab-variants).
CACHE_MIN_LANES = 512
CACHE_MIN_K = 8
CACHE_DEEP_MAX_TOKENS = 16384
cache_rounds_override: int | None = None
# CACHE_SMEM (2026-12-07 night): the cached rounds with each group's cache in shared memory (the kernel's
# _cache_rounds_smem, one inline-PTX call a lane), where a round's pop is a predicated load and add instead of
# CACHE_DEPTH - 1 selects on every lane: sm_90 SASS of the fast path at T = 65536, 512 top-22 916 -> 832 instructions
# a row, 375 -> 254 on the ALU pipe, 896 top-16 900 -> 870 and 467 -> 376. For one-warp rows with 32 word columns
# without the rounds' scalar checks; the interpreter keeps the registers' form. H100 run 197, the same launches with /
# without: 512 top-22 T=16384 25.84 / 26.37 us, 32768 43.16 / 45.31, 65536 74.71 / 78.40, but 4096 11.04 / 10.69; 896
# top-16 slower at every T (65536 105.85 / 102.41, 4096 15.73 / 15.02). So the launcher takes it from top-17
# (CACHE_SMEM_MIN_K: 18 rounds or more) and T = CACHE_SMEM_MIN_TOKENS. test_cache_smem_rounds_route_bit_for_bit_alike
# passed there. cache_smem_override forces it on or off where it applies (tests, --ab-variants cache-smem).
CACHE_SMEM = True
CACHE_SMEM_MIN_K = 17
CACHE_SMEM_MIN_TOKENS = 16384
cache_smem_override: bool | None = None
# Softmax without renormalization (no bias: truncated score words) of bf16 / fp16 logits selects on words of the
# logits' own bits (the kernel's TRUNC_LOGIT_WORDS; checks as the logit keys'), where the truncated scores flagged every
# exact tie (CPU survey 2026-12-05: 9-22% of bf16 OLMoE, DeepSeek-V2(-Lite), Qwen1.5-MoE programs redone, fp32 ~0%).
# H100 run 134 (BENCHMARKS.md), the same launches with and without: OLMoE bf16 T=1 1.43 against 1.55 us, T=64 1.52
# against 2.26, T=65536 31.3 against 37.2; Qwen3-Next / Qwen3.5 (logit keys, not this path) level.
# trunc_logit_words_override forces it on or off (tests, --ab-variants trunc-logit-words,trunc-score-words).
TRUNC_LOGIT_WORDS = True
trunc_logit_words_override: bool | None = None
# One row a program keeps round i's word at column i of a vector (one a thread): by a compare and a select a round,
# or (SHIFT_WORDS) by shifting the vector a column a round (a shuffle) and selecting column 0 on a predicate held
# across the rounds, reversed once after them: one ALU instruction a round fewer (sm_90 SASS at T = 65536, fast-path
# ALU-pipe instructions a row: 512 top-22 391 -> 375, 896 top-16 467 -> 457, DeepSeek-V3 fp32 195 -> 192), eight
# more instructions a row. H100 run 144, the same launches with / without: 512 top-22 T=1 2.06 / 2.22 us, T=64 2.58 /
# 2.75, T=4096-65536 0.5-0.7% faster (65536 78.85 / 79.39); 896 top-16, DeepSeek-V3 fp32, Kimi-K2, DeepSeek-V4 level
# within 1% at T = 1-65536. So the launcher takes it beyond top-16 (SHIFT_WORDS_MIN_K), where a row runs 18 rounds
# or more; shift_words_override forces it on or off (tests, --ab-variants shift-words,select-words).
SHIFT_WORDS_MIN_K = 17
shift_words_override: bool | None = None

# Rows on warps (kernels/warp_rows_kernel.py): sigmoid / sqrt-softplus rows with a bias, E a power of 2 and a
# multiple of a chunk (a row's threads' 16-byte loads: 32 fp32 / 64 bf16 / fp16 lanes on 8 threads), none of the
# layout's or the config's extras (scale, softcap, placement, shared slots, padding, capture, packed words, expert
# scales, p-norms, zero-filled groups). A row on WARP_ROWS_THREADS threads (32 // WARP_ROWS_THREADS rows a warp),
# WARP_ROWS_WARPS warps a program and ptxas capped at WARP_ROWS_MAX_REGISTERS[threads] registers, each (rows without
# groups, rows with groups) or one value for both. H200 run 173 (BENCHMARKS.md; the bench's --ab on rotated inputs,
# read from HBM): a row on 8 threads, one warp, 64 registers takes DeepSeek-V4 from 38.69 us (32 threads, two warps,
# the kernel before) to 29.50 at T = 65536, 21.15 -> 17.34 at 32768, 12.41 -> 10.56 at 16384 (the router kernel 12.89),
# but 5.20 -> 5.55 at 4096: WARP_ROWS_MIN_TOKENS. With groups 8 threads lose below T = 65536 (DeepSeek-V3 fp32 16384:
# 18.28 against the router kernel's 13.09; the ~13 programs a launch whose groups' scores lie within the keys' error
# redo 8 rows on the exact path, spilled, and the launch waits for the last) and win at 65536 with two warps and 96
# registers (fp32 38.93 against 42.93, bf16 38.19 against 42.98; the exact path as it was then): WARP_ROWS_GROUPS,
# the T from which grouped rows take it, by the logits' element size (None or absent: never). WARP_ROWS_LANES: the
# row widths it takes by default (512 top-22, run 161: 104.7 against 79.8 us at T = 65536 on 32 threads a row; its
# rounds run over 16 lanes a thread, the router kernel's on cached words).
# WARP_ROWS_REPAIR: close rows reordered on the exact keys of their K + 1 + WARP_ROWS_EXTRA best words (_repair)
# rather than redone on the exact path (H100 run 162: DeepSeek-V4 65536 39.71 against 41.35 us, 4096 4.49 / 5.76).
# Since 2026-12-07 only the rows that need the exact path redo it, one at a time over the program's threads (a
# program redid its R rows at once, spilled: the ~5 us a launch that kept grouped rows off below T = 65536 in run
# 173), and WARP_ROWS_MIXED_KEPT: an fp32 bias beside 16-bit logits rounds on the kept groups' lanes too (8 threads a
# row). Timed in H100 run 175 (the bench's --ab, rotated inputs): grouped rows win from T = 32768 on one warp and 64
# registers (DeepSeek-V3 fp32 32768 22.11 us against the router kernel's 23.83, 65536 34.32 / 42.82; bf16 18.42 /
# 23.21 and 30.68 / 42.89), where the old exact path took 27.43 / 40.20 (fp32); rounds on the kept lanes for bf16
# beside an fp32 bias 30.68 against 34.05 at 65536. At 16384 bf16 logits win too (12.07 against 12.88) and fp32 ones
# lose (14.31 against 13.17). Hence WARP_ROWS_GROUPS by the logits' element size (fp32 from 32768, bf16 / fp16 from
# 16384), one warp and 64 registers for both kinds of row.
# warp_rows_override forces the path on (at any T >= 1 and width the config allows) or off (tests, --ab-variants);
# where it is None, a router-kernel override (_ROUTER_KERNEL_OVERRIDES) keeps the path off. The history of a row on
# 32 threads (runs 153-168): docs/kernel.md, "Rows on warps".
WARP_ROWS = True
WARP_ROWS_MIN_TOKENS = 16384
WARP_ROWS_GROUPS: dict[int, int | None] = {4: 32768, 2: 16384}
WARP_ROWS_LANES = (256,)
WARP_ROWS_THREADS = 8
WARP_ROWS_WARPS = 1
WARP_ROWS_MAX_REGISTERS = {32: (32, 32), 16: (64, 64), 8: (64, 64)}
WARP_ROWS_REPAIR = True
WARP_ROWS_EXTRA = 1
WARP_ROWS_MIXED_KEPT = True
# WARP_ROWS_NARROW: the epilogue on a [KE, R] tile of the K winners (KE the power of 2 >= K) where the words' tile is
# wider (DeepSeek-V3: 8 of 16 words), one winner a thread: sm_90 SASS of the fast path 5% shorter (2026-12-07).
WARP_ROWS_NARROW = True
# WARP_ROWS_GROUP_ROUNDS: the kept groups by TOPK_GROUP rounds of a max over the group words where they are at most
# half the groups (DeepSeek-V3: 4 of 8), not by counting the groups above each (2026-12-07).
WARP_ROWS_GROUP_ROUNDS = True
# WARP_ROWS_LAZY_EXTRA: the WARP_ROWS_EXTRA words past the first loser (_repair's bound and candidates only) found in
# _repair's branch, not on the fast path: sm_90 SASS of the fast path 2-4% shorter (DeepSeek-V3, DeepSeek-V4; no local
# memory); H100 run 182: 0.6-2.9% faster at T = 32768-65536 (the bench's rows-a-warp-eager-extra turns it off).
WARP_ROWS_LAZY_EXTRA = True
# WARP_ROWS_LEAN: forms the compiler does not find on its own: bf16 logits widened a 32-bit pair at a time by a shift
# and an and, the kept lanes' distance words by one mad.lo a lane and their rounds' steps four words a thread at a
# time by sub and sub-max (all three PTX, GPU only: the interpreter runs the plain forms), the kept lanes' bias of a
# wider dtype (DeepSeek-V3's fp32 beside bf16 logits) addressed from the logits' pointers, and the kept lanes' keys
# without the finite check (a NaN group score in the first pass flags the row): sm_90 SASS of the fast path
# DeepSeek-V3 bf16 1152 -> 1025 a warp of four rows (-11%), fp32 1160 -> 1098; DeepSeek-V4 (no kept lanes, fp32)
# unchanged. H200 run 186 (the bench's rows-a-warp-no-lean turns it off): DeepSeek-V3 bf16 26.28 against 27.47 us at
# T = 65536, 15.92 / 16.55 at 32768, 10.43 / 10.76 at 16384; fp32 level at 32768 and 65536 (19.03 / 18.98, 30.01 /
# 30.00); test_lean_forms_route_bit_for_bit_alike passed there (20 cases: the PTX forms give the compiler's bits).
WARP_ROWS_LEAN = True
# WARP_ROWS_SMEM_KEPT (on since H100 run 197, 2026-12-07 night): DeepSeek-V3's kept lanes' keys for bf16 / fp16
# logits taken from the first pass's through shared memory (one inline-PTX call a thread: eight 16-byte stores of its
# keys, a warp barrier, four 16-byte loads of its kept lanes) instead of read and scored again: sm_90 SASS of the fast
# path 1025 -> 928 instructions a warp of four rows, 96 -> 64 MUFU operations (docs/kernel.md, "The kept lanes' second
# pass"). H100 run 197, the same launches with / without: DeepSeek-V3 bf16 T=16384 10.56 / 11.17 us, 32768 16.09 /
# 16.53, 65536 26.59 / 27.15, 4096 level; test_smem_kept_routes_bit_for_bit_alike passed there (ids and weights bit
# for bit against the second read). The bench's rows-smem-kept forces it on.
WARP_ROWS_SMEM_KEPT = True
warp_rows_override: bool | None = None


class _Spec(NamedTuple):
    """The integer parameters of one launch (the custom op carries them as a list of ints)."""

    K: int
    C: int
    N_GROUP: int
    GROUP_SIZE: int
    TOPK_GROUP: int
    GROUP_MAX: int
    GROUP_ZERO: int
    SCORING: int
    SELECT_LOGITS: int
    HAS_SOFTCAP: int
    RENORMALIZE: int
    RENORM_P_ONE: int
    EPS_CLAMP: int
    APPLY_RSF: int
    HASH: int
    REPLICA_POLICY: int
    SHARED_MODE: int
    NUM_SHARED: int
    SLOTS_PER_RANK: int
    NUM_PHYSICAL: int
    MAX_REPLICAS: int
    THREAD_ROWS: int
    SPLIT_ROWS: int
    LOGIT_KEYS_OK: int
    num_valid: int  # -1: read from the device tensor
    home_rank: int
    layer: int
    block_m: int
    num_warps: int


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(n: int) -> int:
    """The least power of two >= n (n >= 1): triton.next_power_of_2 without its constexpr-function call (host time on
    every launch)."""
    return 1 << (n - 1).bit_length()


def _tile_shape(config: RouterConfig) -> tuple[int, int]:
    """(BLOCK_G, BLOCK_GS): the row tile [groups, experts per group], each padded to a power of two."""
    if config.n_group == 1:
        return 1, _pow2(config.num_scored)
    return _pow2(config.n_group), _pow2(config.group_size)


def _use_thread_rows(config: RouterConfig) -> bool:
    """One row a thread (the kernel's THREAD_ROWS): rows without groups or hashing, narrow ones by default."""
    eligible = config.n_group == 1 and config.routing != "hash" and config.num_scored <= THREAD_ROWS_MAX_FORCED
    if thread_rows_override is not None:
        return eligible and thread_rows_override
    return eligible and config.num_scored <= THREAD_ROWS_MAX_LANES


def _logit_keys_allowed(config: RouterConfig) -> bool:
    """Whether renormalized softmax may select on the logits (the kernel's LOGIT_KEYS, where the launch shape
    takes them): no score for the W - K unselected lanes, no row sum; the weights exp(x - m) / their sum.
    Needs renorm_eps negligible against that sum (it is >= 1, and the reference's sum of scores is >= K / W),
    no bias, no groups (a top2_sum of logits is not one of scores), no hash routing."""
    return (config.scoring == "softmax" and config.selection == "scores" and not config.has_correction_bias
            and config.routing != "hash" and config.n_group == 1 and config.renormalize and config.renorm_p == 1.0
            and config.renorm_eps * _pow2(config.num_scored) <= 1e-8 * config.top_k)


# The logit keys' equal-run check (a K-th logit repeated by the first loser, where a lower-id logit just below may
# score the same) asks, for bf16 / fp16 logits with no scale or softcap, whether the format's next value below is
# close at all (only near 0); fp32 logits flag every such row. Forced off (False: flag every run, the kernel of run
# 106) by the tests and the benchmark's A/B (--ab-variants every-run).
logit_drop_override: bool | None = None


def _logit_drop(dtype: torch.dtype, unscaled: bool) -> int:
    """The kernel's LOGIT_DROP: the low fp32 mantissa bits that the logits' values leave 0 (bf16 16, fp16 13), or 0
    where they may be any fp32 value (fp32 input, or a scale or softcap applied)."""
    if not unscaled:
        return 0
    return {torch.bfloat16: 16, torch.float16: 13}.get(dtype, 0)


def _split_threads(config: RouterConfig, num_tokens: int) -> int:
    """Threads a row for split rows (the kernel's SPLIT_ROWS), 0 for none: rows without groups or hashing."""
    if config.n_group != 1 or config.routing == "hash":
        return 0
    if split_rows_override is not None:
        q = split_rows_override
        if q and (q not in SPLIT_THREADS or -(-config.num_scored // q) > SPLIT_MAX_COLUMNS):
            raise ValueError(f"split_rows_override={q}: split rows take {SPLIT_THREADS} threads a row and at most "
                             f"{SPLIT_MAX_COLUMNS} of the row's {config.num_scored} columns a thread")
        return q
    if not _logit_keys_allowed(config) or not 64 < config.num_scored <= 128 or num_tokens < SPLIT_MIN_TOKENS:
        return 0
    return 8 if SPLIT_WIDE_TOKENS is not None and num_tokens >= SPLIT_WIDE_TOKENS else 16


def _launch_shape(num_tokens: int, tile: int, thread_rows: bool = False, split: int = 0) -> tuple[int, int]:
    """(rows per program, warps per program).

    A row's top-K is a chain of K reductions; one warp per row keeps them on shuffles. Packing more rows
    into a program or more warps into a row only paid off where the sweep says so. With ``thread_rows``
    a program takes 32 rows a warp (or a multiple), with ``split`` threads a row 32 / split rows a warp.
    """
    if split:
        if launch_override is not None:
            if launch_override[0] * split != 32 * launch_override[1]:
                raise ValueError(f"launch_override={launch_override}: rows on {split} threads need rows per program "
                                 f"* {split} == 32 * warps")
            return launch_override
        warps = 2 if num_tokens >= 16384 else 1
        return 32 * warps // split, warps
    if thread_rows:
        if launch_override is not None:
            if launch_override[0] % (32 * launch_override[1]):
                raise ValueError(f"launch_override={launch_override}: one row a thread needs rows per program "
                                 "to be a multiple of 32 * warps")
            return launch_override
        # Sweep 14 (Mixtral): one warp of 32 rows best up to T=4096; two warps from 16384 (2.4 vs 2.7 us).
        return (64, 2) if num_tokens >= 16384 else (32, 1)
    if launch_override is not None:
        if launch_override[1] == 1 and launch_override[0] == 1 and tile >= 1024 and exact32_override is False:
            # H200 run 8: one warp on a 1024- or 2048-lane row returns ids past the tile on the exact
            # 64-bit path for a third of the rows (two warps and more are right; cause not found). That launch takes
            # the 32-bit rounds (EXACT32) unless they are forced off.
            raise ValueError(f"launch_override={launch_override}: one warp cannot route a {tile}-lane row "
                             "correctly on the 64-bit rounds (exact32_override=False); use at least two warps")
        return launch_override
    # From the sweeps in BENCHMARKS.md: one warp per row up to 1024 lanes, rows packed only for rows of 128 lanes
    # or fewer (32 and fewer 4-16 a program, 64 and 128 four a program from T = 4096). 1024 lanes on one warp take
    # the 32-bit exact rounds (EXACT32; run 126, 896 top-16: 2.40 / 3.42 / 15.8 / 130.9 us at T = 1 / 64 / 4096 /
    # 65536 against 3.12 / 3.88 / 21.3 / 264.6 on four warps); wider rows keep a warp per 256 lanes.
    if tile <= 32:
        if num_tokens == 1:
            # The flat one-row path (logit keys for renormalized softmax) has the shorter chain: Mixtral
            # T=1, back to back in one process, 1.29 vs 1.58 us (run 10 A/B) and 1.32 vs 1.72 (sweep 13).
            return 1, 1
        return (16 if num_tokens >= 16384 else 8 if num_tokens >= 2048 else 4), 1
    if tile <= 128:
        # 33-128 lanes (rows that neither one row a thread nor split rows take): four rows a one-warp program from
        # T = 4096. H100 runs 135-136, 64 lanes, four rows against the two they had: OLMoE bf16 (softmax without
        # renormalization, top-8) 3.36 / 7.47 / 22.0 us against 5.28 / 9.78 / 31.5 at T = 4096 / 16384 / 65536
        # (SGLang 25.6 at 65536), the same routing on fp32 logits 4.08 / 8.65 / 24.3 against 4.84 / 8.74 / 26.8; one
        # row a program still ahead at T = 1024 (2.53 against 2.65 on two rows, 2.87 on four). H100 run 137, 128 lanes
        # (top-8 sigmoid + bias), four rows against one: 4.11 / 10.02 / 26.7 us against 5.25 / 11.90 / 41.4 at
        # T = 4096 / 16384 / 65536 (sweep 13 had four rows only from 32768, for Qwen3, which takes split rows now);
        # run 138: one row ahead at T = 2048 (2.75 against 3.28).
        return (4 if num_tokens >= 4096 else 1), 1
    if tile <= 512 or (tile <= 1024 and exact32_override is not False):
        return 1, 1
    return 1, min(16, tile // 256)


def _cache_depth(lanes: int, top_k: int, num_tokens: int) -> int:
    """The kernel's CACHE_DEPTH for one row a program (0: plain rounds): see CACHE_MIN_LANES."""
    if lanes < CACHE_MIN_LANES or top_k < CACHE_MIN_K:
        return 0
    if top_k <= 12:
        return 5
    return 7 if num_tokens < CACHE_DEEP_MAX_TOKENS else 6


def _dist_shift(lane_bits: int, top_k: int, logit_keys: bool = False) -> int:
    """The kernel's DIST_SHIFT: low ulp bits the distance words drop (see DIST_SHIFT_MIN_LANE_BITS); ``logit_keys``:
    the selection keys are fp32 logits (logit keys or selection on the logits), whose words span 2**LOGIT_SPAN_LOG2
    binades."""
    if logit_keys:
        span_log2 = LOGIT_SPAN_LOG2 if logit_span_override is None else logit_span_override
        return max(lane_bits - 8 + span_log2, 0)
    return lane_bits - 8 if (lane_bits >= DIST_SHIFT_MIN_LANE_BITS
                             or (lane_bits == 9 and top_k >= DIST_SHIFT_512_MIN_K)) else 0


def _register_cap(num_tokens: int, lanes: int, block_m: int, num_warps: int, approx_sigmoid_keys: bool,
                  split: int = 0, heavy_words: bool = False) -> int:
    """ptxas's register cap for a launch (0: none; see WIDE_ROW_MAX_REGISTERS, APPROX_KEYS_MAX_REGISTERS,
    MID_ONE_WARP_MAX_REGISTERS and SPLIT_MAX_REGISTERS). heavy_words: shifted distance words or logit keys."""
    if maxnreg_override is not None:
        return maxnreg_override
    if split:
        return SPLIT_MAX_REGISTERS if split == 8 or num_warps >= 2 else 0
    if block_m == 1 and lanes >= APPROX_KEYS_MIN_LANES and num_warps > 1 and num_tokens > 256:
        return WIDE_ROW_MAX_REGISTERS if num_tokens > 2048 else WIDE_ROW_MID_MAX_REGISTERS
    if block_m == 1 and num_warps == 1 and lanes >= APPROX_KEYS_MIN_LANES:
        if lanes == APPROX_KEYS_MIN_LANES and num_tokens >= WIDE_ONE_WARP_LARGE_MIN_TOKENS:
            return WIDE_ONE_WARP_LARGE_MAX_REGISTERS
        return WIDE_ONE_WARP_MAX_REGISTERS
    if block_m == 1 and num_warps == 1 and approx_sigmoid_keys:
        return APPROX_KEYS_MAX_REGISTERS
    if block_m == 1 and num_warps == 1 and lanes == 512 and heavy_words and num_tokens >= MID_ONE_WARP_MIN_TOKENS:
        return MID_ONE_WARP_MAX_REGISTERS
    return 0


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    """Programmatic dependent launch (griddepcontrol) needs sm_90 or newer."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.cache
def _redux_capable(device_index: int) -> bool:
    """A warp's redux.sync (CACHE_SMEM's rounds) needs sm_80 or newer."""
    return torch.cuda.get_device_capability(device_index)[0] >= 8


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _pdl_wanted(num_tokens: int, thread_rows: bool, split: int, num_warps: int) -> bool:
    """Whether the launcher asks for programmatic dependent launch on a device that has it (see PDL_MAX_TOKENS)."""
    if use_pdl_override is not None:
        return use_pdl_override
    if thread_rows:
        return num_tokens <= PDL_THREAD_MAX_TOKENS
    if split:
        return num_warps >= 2
    return num_tokens <= PDL_MAX_TOKENS


def _use_pdl(device: torch.device, num_tokens: int, thread_rows: bool, split: int, num_warps: int) -> bool:
    if _interpreting() or device.type != "cuda" or not _pdl_wanted(num_tokens, thread_rows, split, num_warps):
        return False
    return _pdl_capable(_device_index(device))


def _pdl_trigger(num_tokens: int, block_m: int) -> int:
    """The kernel's PDL_TRIGGER: after the selection for small launches of one row a program, else at the start."""
    if pdl_trigger_override is not None:
        return pdl_trigger_override
    return 1 if (block_m == 1 and num_tokens <= PDL_LATE_MAX_TOKENS) else 0


def _launch(
    logits, bias, expert_scale, num_valid, token_ids, hash_table, l2p, replica_count,
    weights, ids, packed, rec_ids, rec_count, spec: _Spec, params: list[float],
) -> None:
    """Launch the kernel on validated inputs; every output is written in place."""
    T = logits.shape[0]
    logit_scale, softcap, renorm_eps, renorm_p, inv_renorm_p, rsf, shared_weight = params
    plan = _warp_rows_plan(logits, bias, expert_scale, num_valid, hash_table, l2p, packed, rec_ids, spec, logit_scale)
    if plan is not None:
        _launch_warp_rows(logits, bias, weights, ids, spec, renorm_eps, rsf, *plan)
        return
    dummy = rec_count if rec_count is not None else weights  # pointer for arguments a constexpr turns off
    block_g, block_gs = (1, _pow2(spec.GROUP_SIZE)) if spec.N_GROUP == 1 else (
        _pow2(spec.N_GROUP), _pow2(spec.GROUP_SIZE)
    )
    rec_layer = rec_ids[spec.layer] if rec_ids is not None else None
    grid = (max(1, -(-T // spec.block_m)),)
    lane_bits = (block_g * block_gs).bit_length() - 1
    select_truncated = (spec.SCORING == 0 and not spec.SELECT_LOGITS) and bias is None  # softmax scores
    # Weights from the tile (no second gather) wherever the tile holds the scores and the epilogue is the
    # plain one: not for logits selection (the tile holds no scores), hash routing, p-norms, packed words.
    tile_weights = not (spec.HASH or spec.SELECT_LOGITS or packed is not None or spec.THREAD_ROWS or spec.SPLIT_ROWS
                        or (spec.RENORMALIZE and not spec.RENORM_P_ONE))
    if tile_weights and spec.block_m == 1:
        tile_weights = False  # one row a program selects without marking the winners' lanes
    if tile_weights:
        if tile_weights_override is not None:
            tile_weights = tile_weights_override
        else:
            per_thread = spec.block_m * block_g * block_gs // (32 * spec.num_warps)
            tile_weights = T <= TILE_WEIGHTS_MAX_TOKENS and per_thread <= TILE_WEIGHTS_MAX_LANES_PER_THREAD
    # Fast sigmoid / sqrt-softplus keys where the exact ones only select: one row a program (the margin checks
    # run on the flat round words), not for weights from the tile. bf16 / fp16 logits without a bias tie often
    # (equal logits, equal keys), and every tie fails the margin check: those keep the exact keys.
    approx_able = spec.SCORING in (1, 2) and not spec.SELECT_LOGITS and not spec.HASH and not tile_weights \
        and spec.block_m == 1
    any_t = APPROX_REPAIR and spec.N_GROUP == 1  # the repair keeps close rows cheap at every T
    if spec.SCORING == 1:
        lanes = block_g * block_gs
        large = T * lanes >= APPROX_KEYS_MIN_LANE_ROWS
        approx_keys = (approx_able and (bias is not None or logits.dtype == torch.float32)
                       and ((lanes >= APPROX_KEYS_MIN_LANES and (any_t or T == 1 or large))
                            or (APPROX_KEYS_NARROW_MIN_LANES <= lanes < APPROX_KEYS_MIN_LANES
                                and not _dist_shift(lane_bits, spec.K) and large)))
    else:
        approx_keys = (approx_able and APPROX_SSP_KEYS and (bias is not None or logits.dtype == torch.float32)
                       and (any_t or T <= APPROX_SSP_SMALL_MAX_TOKENS or T >= APPROX_SSP_MIN_TOKENS))
    if approx_keys_override is not None:
        approx_keys = approx_keys_override and approx_able
    # Close fast-key winners reordered on exact keys rather than the row redone (_approx_repair): rows without
    # groups, off by default (see APPROX_REPAIR).
    approx_repair = approx_keys and spec.N_GROUP == 1 and APPROX_REPAIR and T < APPROX_REPAIR_MAX_TOKENS
    if approx_repair_override is not None:
        approx_repair = approx_keys and spec.N_GROUP == 1 and approx_repair_override
    # Exact sigmoid / sqrt-softplus keys on rows on warps, not the tile's weights (they come from the same scores).
    fma_able = (spec.SCORING in (1, 2) and not spec.SELECT_LOGITS and not spec.HASH and not spec.THREAD_ROWS
                and not spec.SPLIT_ROWS and not tile_weights and not approx_keys)
    fma_keys = fma_able and FMA_KEYS
    if fma_keys_override is not None:
        fma_keys = fma_able and fma_keys_override
    # Renormalized softmax selected on the logits (LOGIT_KEYS, see _logit_keys_allowed): with one row a
    # program, one row a thread or split rows (their words and checks), and the gather's weights.
    logit_keys = bool(spec.LOGIT_KEYS_OK and (spec.block_m == 1 or spec.THREAD_ROWS or spec.SPLIT_ROWS)
                      and not tile_weights)
    if logit_keys_override is not None:
        logit_keys = logit_keys and logit_keys_override
    select_truncated = select_truncated and not logit_keys and not spec.THREAD_ROWS and not spec.SPLIT_ROWS
    bias_early_able = bias is not None and not spec.HASH and not spec.THREAD_ROWS and not spec.SPLIT_ROWS
    bias_early = bias_early_able and spec.SCORING == 2 and approx_keys and T <= BIAS_EARLY_MAX_TOKENS
    if bias_early_override is not None:
        bias_early = bias_early_able and bias_early_override
    winners_in_regs = bool(spec.THREAD_ROWS) and logit_keys and (
        THREAD_WINNERS_IN_REGS if winners_in_regs_override is None else winners_in_regs_override)
    scalar_checks_able = spec.block_m == 1 and not (select_truncated or approx_repair or spec.THREAD_ROWS
                                                    or spec.SPLIT_ROWS or spec.HASH)
    if scalar_checks_override is not None:
        scalar_checks = scalar_checks_able and scalar_checks_override
    else:
        scalar_checks = (scalar_checks_able and spec.num_warps == 1 and not logit_keys
                         and T * spec.K <= SCALAR_CHECKS_MAX_TOKEN_COLUMNS)
    kept_only_able = (spec.block_m == 1 and spec.N_GROUP > 1 and not spec.GROUP_ZERO and not select_truncated
                      and (approx_keys or fma_keys) and block_g <= 16 and spec.TOPK_GROUP <= 8
                      and spec.GROUP_SIZE == block_gs)
    # By default on fast keys only: FMA keys cost more to compute again than the rounds save (sass_count.py,
    # DeepSeek-V3 T = 1: 639 instructions and 2058 modelled cycles against 611 and 1892).
    kept_only = kept_only_able and (KEPT_ONLY and approx_keys if kept_only_override is None else kept_only_override)
    # Logits that are bf16 / fp16 values (no scale, softcap or bias on them): their low mantissa bits are 0.
    format_drop = _logit_drop(logits.dtype, logit_scale == 1.0 and not spec.HAS_SOFTCAP and bias is None)
    # Truncated softmax words of such logits: the logits' own bits (fp16's shifted bits fit beside up to 4096 lanes).
    trunc_logit_words = bool(select_truncated and format_drop and not spec.GROUP_ZERO
                             and (format_drop == 16 or lane_bits <= 12))
    trunc_logit_words = trunc_logit_words and (TRUNC_LOGIT_WORDS if trunc_logit_words_override is None
                                               else trunc_logit_words_override)
    logit_drop = format_drop if (logit_keys or trunc_logit_words) and logit_drop_override is not False else 0
    trunc_logit_words = trunc_logit_words and logit_drop > 0
    use_pdl = _use_pdl(logits.device, T, bool(spec.THREAD_ROWS), spec.SPLIT_ROWS, spec.num_warps)
    extra = {"launch_pdl": True} if use_pdl else {}
    # Logit keys of bf16 / fp16 values sit in the words as their own bits shifted right by LOGIT_DROP (the kernel's
    # KEY_SHIFT, with DIST_SHIFT 0 only): exact, and the distance spans every finite bf16 value at any width, every
    # fp16 one up to 4096 lanes, so no shift at any width (with one, their exact ties would share a distance).
    if logit_span_override not in (None, 0, 1, 2):
        raise ValueError(f"logit_span_override={logit_span_override!r}: 0, 1 or 2 (log2 of the binades spanned)")
    if logit_keys and logit_drop:
        dist_shift = 0
    else:
        dist_shift = _dist_shift(lane_bits, spec.K, (logit_keys or bool(spec.SELECT_LOGITS)) and not format_drop)
    # A thread's own lanes: the logits' 16-byte loads give it 4 fp32 or 8 bf16 / fp16 adjacent lanes a block.
    cache_vec = 16 // logits.element_size() if logits.stride(1) == 1 else 1
    cache_able = (spec.block_m == 1 and spec.num_warps == 1
                  and not (spec.THREAD_ROWS or spec.SPLIT_ROWS or spec.HASH or select_truncated or kept_only)
                  and (block_g * block_gs) % (32 * cache_vec) == 0)
    if cache_rounds_override not in (None, 0, 2, 3, 4, 5, 6, 7, 8):
        raise ValueError(f"cache_rounds_override={cache_rounds_override!r}: 0 (plain rounds) or a depth of 2-8")
    cache_depth = (_cache_depth(block_g * block_gs, spec.K, T) if cache_rounds_override is None
                   else cache_rounds_override)
    cache_depth = cache_depth if cache_able else 0
    block_kc = _pow2(spec.K + spec.C + (2 if approx_repair else 1 if spec.block_m == 1 else 0))
    # Its PTX takes a group's words on one lane and the 32 groups on the warp's 32 lanes: the layout Triton gives
    # 16-byte loads of contiguous, 16-byte aligned rows (test_sass). Strided or misaligned logits get another one
    # (several groups a thread, a REDUX over a fraction of them), so those keep the registers' rounds.
    rows_aligned = _rows_16b(logits)
    cache_smem = bool(cache_depth and block_kc == 32 and not scalar_checks and rows_aligned
                      and (CACHE_SMEM and spec.K >= CACHE_SMEM_MIN_K and T >= CACHE_SMEM_MIN_TOKENS
                           if cache_smem_override is None else cache_smem_override)
                      and (logits.device.type != "cuda" or _redux_capable(_device_index(logits.device))))
    maxnreg = _register_cap(T, block_g * block_gs, spec.block_m, spec.num_warps, approx_keys and spec.SCORING == 1,
                            spec.SPLIT_ROWS, heavy_words=bool(dist_shift or logit_keys))
    if maxnreg:
        extra["maxnreg"] = maxnreg
    has_padding = num_valid is None and 0 <= spec.num_valid < T
    row_bytes = logits.shape[1] * logits.element_size()
    prefetch_able = spec.block_m == 1 and spec.num_warps == 1 and logits.stride(1) == 1 and row_bytes <= 4096 \
        and not spec.THREAD_ROWS and not spec.SPLIT_ROWS and not (spec.HASH and spec.SCORING != 0)
    prefetch_rows = (PREFETCH_ROWS if T >= PREFETCH_MIN_TOKENS else 0) if prefetch_rows_override is None \
        else prefetch_rows_override
    prefetch_rows = prefetch_rows if prefetch_able else 0
    # What a constexpr turns off goes in as None (LEAN_PARAMS): Triton then drops it from the kernel's parameters.
    lean = LEAN_PARAMS if lean_params_override is None else lean_params_override

    def scalar(value, used):
        return value if used or not lean else None

    def tensor(t):  # an optional tensor
        return t if t is not None else scalar(dummy, False)

    def stride(t, dim, default=0):
        return t.stride(dim) if t is not None else scalar(default, False)

    p_norm = bool(spec.RENORMALIZE) and not spec.RENORM_P_ONE
    home_used = (spec.C > 0 and spec.SHARED_MODE != 1) or (l2p is not None and spec.REPLICA_POLICY == 1)
    rk._route_kernel[grid](
        logits, weights, ids, tensor(bias),
        logits.stride(0), T, scalar(renorm_eps, spec.RENORMALIZE), scalar(rsf, spec.APPLY_RSF),
        scalar(max(spec.num_valid, 0), has_padding), scalar(shared_weight, spec.C > 0),
        scalar(spec.home_rank, home_used), scalar(logit_scale, logit_scale != 1.0),
        scalar(softcap, spec.HAS_SOFTCAP), scalar(renorm_p, p_norm), scalar(inv_renorm_p, p_norm),
        logits.stride(1), stride(bias, 0),
        tensor(expert_scale), stride(expert_scale, 0),
        tensor(num_valid),
        tensor(token_ids), stride(token_ids, 0),
        tensor(hash_table), stride(hash_table, 0), stride(hash_table, 1),
        hash_table.shape[0] if hash_table is not None else scalar(1, False),
        tensor(l2p), tensor(replica_count),
        tensor(packed),
        tensor(rec_layer), stride(rec_layer, 0),
        tensor(None if rec_count is None else rec_count[spec.layer:]),
        tensor(count_fallbacks_into),
        K=spec.K, C=spec.C, N_GROUP=spec.N_GROUP, GROUP_SIZE=spec.GROUP_SIZE, TOPK_GROUP=spec.TOPK_GROUP,
        GROUP_MAX=bool(spec.GROUP_MAX), GROUP_ZERO=bool(spec.GROUP_ZERO),
        GROUP_BY_COUNT=block_g <= 32,  # counting is G*G compares per row, cheap only for few groups
        SCORING=spec.SCORING, SELECT_LOGITS=bool(spec.SELECT_LOGITS), HAS_SOFTCAP=bool(spec.HAS_SOFTCAP),
        HAS_BIAS=bias is not None, RENORMALIZE=bool(spec.RENORMALIZE), RENORM_P_ONE=bool(spec.RENORM_P_ONE),
        EPS_CLAMP=bool(spec.EPS_CLAMP), HAS_EXPERT_SCALE=expert_scale is not None, APPLY_RSF=bool(spec.APPLY_RSF),
        HASH=bool(spec.HASH), HAS_PLACEMENT=l2p is not None, MAX_REPLICAS=spec.MAX_REPLICAS,
        REPLICA_POLICY=spec.REPLICA_POLICY, SHARED_MODE=spec.SHARED_MODE, NUM_SHARED=spec.NUM_SHARED,
        SLOTS_PER_RANK=spec.SLOTS_PER_RANK, NUM_PHYSICAL=spec.NUM_PHYSICAL,
        VALID_FROM_PTR=num_valid is not None, HAS_PADDING=has_padding,
        HAS_RECORDER=rec_ids is not None, HAS_PACKED=packed is not None,
        BLOCK_M=spec.block_m, BLOCK_W=block_g * block_gs,
        LANE_BITS=lane_bits, TRUNCATE_WORDS=select_truncated,
        BLOCK_G=block_g, BLOCK_GS=block_gs,
        # One row a program: one more column for the (K + 1)-th round's word of the margin checks (two with the repair).
        BLOCK_KC=block_kc,
        DIST_SHIFT=dist_shift,
        HAS_SCALE=logit_scale != 1.0, TILE_WEIGHTS=tile_weights, APPROX_KEYS=approx_keys, APPROX_REPAIR=approx_repair,
        LOGIT_KEYS=logit_keys, LOGIT_DROP=logit_drop,
        THREAD_ROWS=bool(spec.THREAD_ROWS), SPLIT_ROWS=spec.SPLIT_ROWS,
        PAIR_EXACT=bool(spec.SPLIT_ROWS and logit_keys and (SPLIT_PAIR_EXACT if split_pair_exact_override is None
                                                              else split_pair_exact_override)),
        FORCE_EXACT=force_exact_override, COUNT_FALLBACKS=count_fallbacks_into is not None, FMA_KEYS=fma_keys,
        BIAS_EARLY=bias_early, WINNERS_IN_REGS=winners_in_regs, SCALAR_CHECKS=scalar_checks,
        KEPT_ONLY=kept_only, NAN_DEAD_OK=nan_dead_override is not False, ROWS_IN_RANGE=spec.block_m == 1 and T >= 1,
        EXACT32=(spec.num_warps == 1 and block_g * block_gs >= 1024) if exact32_override is None else exact32_override,
        CACHE_DEPTH=cache_depth, CACHE_VEC=cache_vec, CACHE_SMEM=cache_smem, ROWS_16B=rows_aligned,
        TRUNC_LOGIT_WORDS=trunc_logit_words,
        SHIFT_WORDS=spec.block_m == 1 and (spec.K >= SHIFT_WORDS_MIN_K if shift_words_override is None
                                           else shift_words_override),
        PREFETCH_ROWS=prefetch_rows, PREFETCH_LINES=-(-row_bytes // 128) if prefetch_rows else 0,
        USE_PDL=use_pdl, PDL_TRIGGER=_pdl_trigger(T, spec.block_m), ACCURATE=not _interpreting(),
        num_warps=spec.num_warps, **extra,
    )


# The overrides that shape the router kernel's launch (tests, --ab-variants). Where one is set, the launcher leaves
# the rows-on-warps kernel out unless warp_rows_override forces it on, so that a variant named for the router kernel
# times the router kernel at every T. maxnreg_override and force_exact_override apply to both kernels.
_ROUTER_KERNEL_OVERRIDES = tuple(name for name in list(globals()) if name.endswith("_override")
                                 and name not in ("warp_rows_override", "maxnreg_override", "force_exact_override"))


def _router_kernel_forced() -> bool:
    g = globals()
    return any(g[name] is not None for name in _ROUTER_KERNEL_OVERRIDES)


def _warp_rows_plan(logits, bias, expert_scale, num_valid, hash_table, l2p, packed, rec_ids, spec: _Spec,
                    logit_scale: float):
    """(rows a program, chunks, lanes a chunk, KEPT, bias offset or None, words) where the launch takes the
    rows-on-warps kernel (see WARP_ROWS), else None."""
    T = logits.shape[0]
    lanes = spec.N_GROUP * spec.GROUP_SIZE
    grouped = spec.N_GROUP > 1
    groups_from = WARP_ROWS_GROUPS.get(logits.element_size())
    on = (WARP_ROWS and T >= WARP_ROWS_MIN_TOKENS and lanes in WARP_ROWS_LANES
          and (not grouped or (groups_from is not None and T >= groups_from)) and not _router_kernel_forced()
          if warp_rows_override is None else warp_rows_override)
    if not on or T < 1 or bias is None or logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    if (spec.SCORING not in (1, 2) or spec.SELECT_LOGITS or spec.HASH or spec.HAS_SOFTCAP or logit_scale != 1.0
            or spec.C or spec.SHARED_MODE or spec.GROUP_ZERO or (spec.RENORMALIZE and not spec.RENORM_P_ONE)
            or expert_scale is not None or num_valid is not None or 0 <= spec.num_valid < T or hash_table is not None
            or l2p is not None or packed is not None or rec_ids is not None or spec.K > 31):
        return None
    esize = logits.element_size()
    threads = WARP_ROWS_THREADS
    chunk = threads * (16 // esize)  # a thread's 16-byte load of adjacent lanes, `threads` threads a row
    if (lanes & (lanes - 1) or lanes % chunk or not _rows_16b(logits) or bias.stride(0) != 1
            or bias.data_ptr() % 16 or (spec.N_GROUP > 1 and (spec.GROUP_SIZE & (spec.GROUP_SIZE - 1)
                                                             or spec.N_GROUP > 32))):
        return None
    # The kept groups' lanes read again (KEPT): 128 of them, four adjacent a thread, the bias through the logits'
    # pointers (the same dtype, 16-byte offsets: the bias offset in elements, else None); a bias of another dtype
    # (DeepSeek-V3's fp32 bias beside bf16 logits) through its own, on 8 threads a row (WARP_ROWS_MIXED_KEPT: the
    # fast path a row 374 -> 340 sm_90 instructions; on 32 threads Triton converts those pointers' layout).
    offset = bias.data_ptr() - logits.data_ptr()
    by_offset = bias.dtype == logits.dtype and offset % 16 == 0
    kept = (spec.N_GROUP > 1 and spec.TOPK_GROUP * spec.GROUP_SIZE == 128 and spec.GROUP_SIZE % 4 == 0
            and spec.N_GROUP <= 16 and spec.TOPK_GROUP <= 8 and (by_offset or threads <= 8 and WARP_ROWS_MIXED_KEPT))
    # The epilogue's [words, R] tiles: a word a thread, K + 1 + EXTRA of them (the winners, the first loser, _repair's
    # extra candidates), at least a row's threads, at most 32.
    words = min(32, max(threads, 1 << (spec.K + WARP_ROWS_EXTRA).bit_length()))
    warps = _by_groups(WARP_ROWS_WARPS, grouped)
    return warps * (32 // threads), lanes // chunk, chunk, kept, offset // esize if kept and by_offset else None, words


def _by_groups(value, grouped: bool):
    """A WARP_ROWS_ setting: (rows without groups, rows with groups), or one value for both."""
    return value[grouped] if isinstance(value, tuple) else value


def _rows_16b(logits) -> bool:
    """Contiguous rows, each starting 16-byte aligned: the router kernel's ROWS_16B (the rows-on-warps kernel takes
    no others). Triton proves the rows' alignment itself only where the row stride is a multiple of 16 elements; told
    so, it gives rows 260 or 264 elements apart (a view of a wider buffer) the 16-byte loads and the layouts of
    contiguous rows, which the layout-bound PTX forms assume (the packed round steps, the kept lanes through shared
    memory, CACHE_SMEM's rounds; test_sass.py::test_layout_bound_ptx_only_on_the_layouts_it_assumes)."""
    return (logits.stride(1) == 1 and (logits.stride(0) * logits.element_size()) % 16 == 0
            and logits.data_ptr() % 16 == 0)


def _smem_kept(spec: _Spec, kept: bool, logits, rows: int, chunks: int, chunk: int) -> bool:
    """WARP_ROWS_SMEM_KEPT where its PTX applies: the kept groups' lanes (4 groups of 32 of 256) of bf16 / fp16 logits
    on 8 threads a row (a chunk of 64 lanes), 4 or 8 rows a program."""
    return bool(WARP_ROWS_SMEM_KEPT and kept and logits.element_size() == 2 and chunk == 64 and chunks == 4
                and rows in (4, 8) and spec.GROUP_SIZE == 32 and spec.TOPK_GROUP == 4)


def _launch_warp_rows(logits, bias, weights, ids, spec: _Spec, renorm_eps: float, rsf: float, rows: int,
                      chunks: int, chunk: int, kept: bool, bias_offset: int | None, words: int) -> None:
    T = logits.shape[0]
    threads = chunk * logits.element_size() // 16  # a row's threads: 32 // threads rows a warp
    cap = _by_groups(WARP_ROWS_MAX_REGISTERS.get(threads), spec.N_GROUP > 1)
    extra = {"maxnreg": cap} if cap else {}
    if maxnreg_override is not None:
        extra = {"maxnreg": maxnreg_override} if maxnreg_override else {}
    stats = count_fallbacks_into
    wrk._warp_rows_kernel[(-(-T // rows),)](
        logits, weights, ids, bias,
        logits.stride(0), T, renorm_eps if spec.RENORMALIZE else None, rsf if spec.APPLY_RSF else None,
        bias_offset, stats,
        K=spec.K, N_GROUP=spec.N_GROUP, GROUP_SIZE=spec.GROUP_SIZE, TOPK_GROUP=spec.TOPK_GROUP,
        GROUP_MAX=bool(spec.GROUP_MAX), SCORING=spec.SCORING, RENORMALIZE=bool(spec.RENORMALIZE),
        EPS_CLAMP=bool(spec.EPS_CLAMP), APPLY_RSF=bool(spec.APPLY_RSF), R=rows, NC=chunks, LT=chunk, KC=words,
        KEPT=kept, BIAS_BY_OFFSET=bias_offset is not None, REPAIR=WARP_ROWS_REPAIR,
        EXTRA=min(WARP_ROWS_EXTRA, words - 1 - spec.K),  # at most `words` words
        FORCE_EXACT=force_exact_override, NARROW=WARP_ROWS_NARROW, GROUP_ROUNDS=WARP_ROWS_GROUP_ROUNDS,
        LAZY_EXTRA=WARP_ROWS_LAZY_EXTRA, LEAN=WARP_ROWS_LEAN,
        SMEM_KEPT=_smem_kept(spec, kept, logits, rows, chunks, chunk),
        COUNT_FALLBACKS=stats is not None, ACCURATE=not _interpreting(), num_warps=rows * threads // 32, **extra,
    )


@torch.library.custom_op(
    "moegate::route_fused", mutates_args=("weights", "ids", "packed", "rec_ids", "rec_count"), device_types=None
)
def _route_op(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    expert_scale: torch.Tensor | None,
    num_valid: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    hash_table: torch.Tensor | None,
    l2p: torch.Tensor | None,
    replica_count: torch.Tensor | None,
    weights: torch.Tensor,
    ids: torch.Tensor,
    packed: torch.Tensor | None,
    rec_ids: torch.Tensor | None,
    rec_count: torch.Tensor | None,
    spec: list[int],
    params: list[float],
    traced: bool = False,
) -> None:
    spec = _Spec(*spec)
    if traced:
        # Traced by torch.compile, route() could not compare the buffers' memory (fake tensors have none): the
        # compiled call compares them here, on the real tensors, before its launch (a write into the bias, say,
        # would reach rows that other programs have yet to read). Eager calls were checked by route() already.
        _check_no_aliasing(
            [("out[0] (weights)", weights), ("out[1] (ids)", ids), ("packed_out", packed),
             ("the recorder's ids", rec_ids), ("the recorder's num_tokens", rec_count)],
            [("the logits", logits), ("the bias", bias), ("expert_scale", expert_scale), ("token_ids", token_ids),
             ("hash_table", hash_table), ("num_valid_tokens", num_valid)])
    if hash_table is not None:
        # route() checked the table where it ran eagerly (a cache hit here); a traced graph reads no table, so a
        # compiled call is checked here, on the real tensors, before its launch.
        _check_hash_table(hash_table, spec.N_GROUP * spec.GROUP_SIZE, spec.K, logits.device)
    _launch_on_device(logits, bias, expert_scale, num_valid, token_ids, hash_table, l2p, replica_count,
                      weights, ids, packed, rec_ids, rec_count, spec, params)


class _LaunchRecorder:
    """Stands in for the router kernel: ``recorder[grid](*args, **kwargs)`` appends the launch's keyword arguments
    (constexprs, launch options) to ``seen``, then launches ``kernel`` (or nothing, with ``run=False``)."""

    def __init__(self, kernel, seen: list, run: bool = True):
        self.kernel, self.seen, self.run = kernel, seen, run

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append(kwargs)
            if self.run:
                return self.kernel[grid](*args, **kwargs)
        return launch


@contextlib.contextmanager
def recorded_launches(run: bool = True):
    """Inside, every launch of the router kernel (or of the rows-on-warps kernel, whose keyword arguments hold R and
    KEPT) appends its keyword arguments (the constexprs that name its path:
    APPROX_KEYS, KEPT_ONLY, BLOCK_M, num_warps, ...) to the list this yields; with ``run=False`` nothing is launched
    (host-time measurements: what is left is moegate's own path). For scripts and tests; not thread-safe."""
    kernel, warp_rows, seen = rk._route_kernel, wrk._warp_rows_kernel, []
    rk._route_kernel = _LaunchRecorder(kernel, seen, run)
    wrk._warp_rows_kernel = _LaunchRecorder(warp_rows, seen, run)
    try:
        yield seen
    finally:
        rk._route_kernel = kernel
        wrk._warp_rows_kernel = warp_rows


def _launch_on_device(logits, *args) -> None:
    """_launch on the logits' device: Triton launches on the current device and its current stream, so they are made
    the logits' (several GPUs in one process, e.g. a model spread over devices) and the launch follows the stream
    that produced the logits."""
    if logits.is_cuda and logits.device.index != torch.cuda.current_device():
        with torch.cuda.device(logits.device):
            _launch(logits, *args)
    else:
        _launch(logits, *args)


def _plain_eager(logits: torch.Tensor) -> bool:
    """Whether a call runs eagerly on plain tensors: no torch.compile / export tracing, no dispatch mode
    (FakeTensorMode, make_fx's proxy mode, a user's TorchDispatchMode) and no functorch transform (vmap, grad), which
    need the custom op to see the call; nor a tensor subclass (a FakeTensor, say), nor torch.jit.trace (whose graph
    would hold the outputs' allocation and no launch)."""
    return (type(logits) is torch.Tensor and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0 and not torch._C._are_functorch_transforms_active()
            and torch._C._get_tracing_state() is None)


@_route_op.register_fake
def _route_op_fake(
    logits, bias, expert_scale, num_valid, token_ids, hash_table, l2p, replica_count,
    weights, ids, packed, rec_ids, rec_count, spec, params, traced=False,
) -> None:
    # The op only writes into the buffers it is given: nothing to allocate, no shapes to invent.
    return None


def _kernel_limit(config: RouterConfig, layout: ExpertLayout) -> str | None:
    """Why one launch cannot take this config and layout (docs/kernel.md, "Limits"), or None where it can.
    route(backend="auto") takes the reference for these; backend="triton" raises a ValueError with the message."""
    block_g, block_gs = _tile_shape(config)
    if block_g * block_gs > MAX_TILE:
        return (
            f"num_experts + num_zero_experts = {config.num_scored} in n_group={config.n_group} groups pads to a "
            f"row tile of {block_g} x {block_gs} = {block_g * block_gs} lanes; the Triton router takes at most "
            f"{MAX_TILE}"
        )
    if config.top_k > MAX_TOP_K:
        return f"top_k must be <= {MAX_TOP_K} for the Triton router, got top_k={config.top_k}"
    C = layout.num_shared_columns(config.num_shared_experts)
    if C > MAX_SHARED_COLUMNS:
        return (
            f"num_shared_experts must be <= {MAX_SHARED_COLUMNS} with shared columns for the Triton router, "
            f"got {config.num_shared_experts}"
        )
    if layout.placement is not None and layout.placement.max_replicas > MAX_REPLICAS:
        return (
            f"an expert may have at most {MAX_REPLICAS} replicas for the Triton router, got "
            f"{layout.placement.max_replicas}"
        )
    if config.has_expert_scale and config.num_zero_experts:
        return (
            f"has_expert_scale with num_zero_experts={config.num_zero_experts}: expert_scale is [E] and has no "
            "entry for the zero experts a row may select"
        )
    return None


def _check_kernel_support(logits, config: RouterConfig, layout: ExpertLayout, packed_out) -> None:
    """Raise ValueError for what one launch cannot take, before anything runs."""
    if logits.device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU), got logits on {logits.device}"
        )
    kernel = rk._route_kernel
    compiled = triton.runtime.JITFunction
    if logits.device.type != "cuda" and (isinstance(kernel, compiled) or (
            type(kernel).__name__ == "InterpretedFunction"
            and isinstance(triton.language.standard.sum, compiled))):
        # Triton fixes interpreted or compiled when it decorates a function, at import (moegate's kernel, and
        # triton's own tl.sum & co.): set later, the variable would pass the check above and the launch would
        # look for a GPU driver, or call a compiled helper from the interpreter.
        raise ValueError("backend='triton' on CPU tensors: TRITON_INTERPRET=1 was set after moegate's kernel was "
                         "imported; set it before importing moegate (or triton)")
    limit = _kernel_limit(config, layout)
    if limit is not None:
        raise ValueError(limit)
    if packed_out is not None:
        T, C = logits.shape[0], layout.num_shared_columns(config.num_shared_experts)
        if not isinstance(packed_out, torch.Tensor) or packed_out.dtype != torch.int32:
            raise TypeError(f"packed_out must be an int32 tensor, got {getattr(packed_out, 'dtype', packed_out)}")
        if tuple(packed_out.shape) != (T, config.top_k + C) or not packed_out.is_contiguous():
            raise ValueError(
                f"packed_out must be contiguous with shape {(T, config.top_k + C)}, got {tuple(packed_out.shape)}"
            )
        if packed_out.device != logits.device:
            raise ValueError(f"packed_out is on {packed_out.device}, but logits are on {logits.device}")
        space = layout.id_space(config.num_experts, config.num_shared_experts) if not config.num_zero_experts \
            else config.num_scored
        if space - 1 > MAX_PACKED_ID:
            raise ValueError(
                f"packed_out holds ids up to {MAX_PACKED_ID} (id << 16 in int32), but the layout's id space is "
                f"[0, {space})"
            )


def route_triton(
    logits: torch.Tensor,
    config: RouterConfig,
    layout: ExpertLayout,
    *,
    bias: torch.Tensor | None = None,
    num_valid_tokens=None,
    home_rank: int = 0,
    token_ids: torch.Tensor | None = None,
    hash_table: torch.Tensor | None = None,
    expert_scale: torch.Tensor | None = None,
    recorder=None,
    layer: int = 0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    packed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/contract.md steps 1-12 in one Triton launch.

    Algorithm (per row, in registers)
    ---------------------------------
    1. x = logit_scale * logits, then the softcap; NaN and -inf become -inf.
    2. Scores (softmax with the row max and sum of the tile, sigmoid, sqrt-softplus).
    3. Keys (scores or logits, + bias), packed with the expert id into one sortable int64 word.
    4. Groups: group scores from the words, the kept groups by counting the groups above each one;
       dropped groups are excluded (word below every key) or zero-filled.
    5. K rounds of one max each; each round's word names the expert.
    6-8. Weights recomputed from a gather of the K winners' logits, renormalised, scaled.
    9-12. Placement, shared columns, padding, capture, stored once.

    Parameters
    ----------
    logits, config, layout, bias, num_valid_tokens, home_rank, token_ids, hash_table, expert_scale,
    recorder, layer, out
        As ``moegate.route``, and checked as it checks them (``moegate.router._check_route_args``).
    packed_out : int32 Tensor [T, K + C], contiguous, optional
        Also written: ``(id << 16) | bf16 bits of the weight`` (ids -1 on padded rows). Needs ids < 32768.

    Returns
    -------
    (weights float32 [T, K + C], ids int32 [T, K + C]); ``out`` itself when given.

    Raises
    ------
    ValueError before any launch for what the kernel cannot take: a row tile over 16384 lanes,
    top_k > 64, more than 64 shared columns, more than 64 replicas of an expert, has_expert_scale with
    zero experts, packed ids past 32767, tensors off CUDA (unless TRITON_INTERPRET=1).

    Notes
    -----
    No host synchronisation (a device ``num_valid_tokens`` is read by the kernel) and, with ``out``,
    no allocation: capturable in a CUDA graph. Registered as the custom op ``moegate::route_fused``
    with a fake implementation, so torch.compile(fullgraph=True) traces through it; an eager call on plain
    tensors (no tracing, dispatch mode or functorch transform) launches without the op's dispatch, a host-time
    saving, and bumps the outputs' version counters as the op would.
    """
    from moegate.router import _check_route_args

    layout = ExpertLayout() if layout is None else layout
    _check_route_args(logits, config, layout, bias, num_valid_tokens, home_rank, token_ids, hash_table, expert_scale,
                      recorder, layer, out, packed_out)
    return _route_triton(logits, config, layout, bias=bias, num_valid_tokens=num_valid_tokens, home_rank=home_rank,
                         token_ids=token_ids, hash_table=hash_table, expert_scale=expert_scale, recorder=recorder,
                         layer=layer, out=out, packed_out=packed_out)


def _route_triton(
    logits: torch.Tensor,
    config: RouterConfig,
    layout: ExpertLayout,
    *,
    bias: torch.Tensor | None = None,
    num_valid_tokens=None,
    home_rank: int = 0,
    token_ids: torch.Tensor | None = None,
    hash_table: torch.Tensor | None = None,
    expert_scale: torch.Tensor | None = None,
    recorder=None,
    layer: int = 0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    packed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """route_triton on arguments route() has checked already."""
    if _needs_grad(logits, bias, expert_scale):
        names = [n for n, t in (("logits", logits), ("bias", bias), ("expert_scale", expert_scale))
                 if isinstance(t, torch.Tensor) and t.requires_grad]
        raise ValueError(
            f"backend='triton' has no backward: {', '.join(names)} require(s) grad, and its weights would be detached "
            "from them; use backend='reference' (or 'auto') to train through the router, or route under "
            "torch.no_grad() / torch.inference_mode()"
        )
    _check_kernel_support(logits, config, layout, packed_out)
    T, device = logits.shape[0], logits.device
    K = config.top_k
    C = layout.num_shared_columns(config.num_shared_experts)
    if out is None:
        weights = torch.empty((T, K + C), dtype=torch.float32, device=device)
        ids = torch.empty((T, K + C), dtype=torch.int32, device=device)
    else:
        weights, ids = out
    l2p = replica_count = None
    max_replicas = 1
    if layout.placement is not None:
        _, l2p, replica_count = layout.placement.tables(device)
        max_replicas = l2p.shape[1]
    E = config.num_experts
    P = layout.num_physical(E)
    block_g, block_gs = _tile_shape(config)
    split = _split_threads(config, T)
    thread_rows = not split and _use_thread_rows(config)
    block_m, num_warps = _launch_shape(T, block_g * block_gs, thread_rows, split)
    num_valid = num_valid_tokens if isinstance(num_valid_tokens, torch.Tensor) else None
    rsf = float(config.routed_scaling_factor)
    spec = _Spec(
        K=K, C=C, N_GROUP=config.n_group, GROUP_SIZE=config.group_size, TOPK_GROUP=config.topk_group,
        GROUP_MAX=int(config.group_score == "max"), GROUP_ZERO=int(config.group_fill == "zero"),
        SCORING=rk.SCORINGS[config.scoring], SELECT_LOGITS=int(config.selection == "logits"),
        HAS_SOFTCAP=int(config.softcap is not None), RENORMALIZE=int(config.renormalize),
        RENORM_P_ONE=int(config.renorm_p == 1.0), EPS_CLAMP=int(config.renorm_eps_mode == "clamp"),
        APPLY_RSF=int(layout.scale == "in_weights" and rsf != 1.0),
        HASH=int(config.routing == "hash"), REPLICA_POLICY=rk.REPLICA_POLICIES[layout.replica_policy],
        SHARED_MODE=rk.SHARED_SLOTS[layout.shared_slots], NUM_SHARED=config.num_shared_experts,
        SLOTS_PER_RANK=P // layout.ep_size, NUM_PHYSICAL=P, MAX_REPLICAS=max_replicas,
        THREAD_ROWS=int(thread_rows), SPLIT_ROWS=split, LOGIT_KEYS_OK=int(_logit_keys_allowed(config)),
        num_valid=-1 if num_valid is not None else (T if num_valid_tokens is None else int(num_valid_tokens)),
        home_rank=home_rank, layer=layer, block_m=block_m, num_warps=num_warps,
    )
    params = [
        float(config.logit_scale), float(config.softcap or 1.0), float(config.renorm_eps),
        float(config.renorm_p), 1.0 / float(config.renorm_p), rsf,
        shared_weight(config, layout),
    ]
    rec_ids = None if recorder is None else recorder.ids
    rec_count = None if recorder is None else recorder.num_tokens
    if _plain_eager(logits):
        # The launch itself, not through the custom op: route() has checked every argument, and the op's dispatch
        # (its autograd and ADInplaceOrView layers) costs more host time than all of moegate's own path
        # (scripts/host_overhead.py: DeepSeek-V3 T = 64 on this project's 2-core CPU, 203 -> 60 us a call with
        # Triton's launch stubbed out). The op bumps the written tensors' version counters; so does this.
        _launch_on_device(logits, bias, expert_scale, num_valid, token_ids, hash_table, l2p, replica_count, weights,
                          ids, packed_out, rec_ids, rec_count, spec, params)
        for t in (weights, ids, packed_out, rec_ids, rec_count):
            if t is not None and not t.is_inference():  # inference tensors keep no version counter
                torch.autograd.graph.increment_version(t)
    else:
        torch.ops.moegate.route_fused(
            logits, bias, expert_scale, num_valid, token_ids, hash_table, l2p, replica_count,
            weights, ids, packed_out, rec_ids, rec_count, list(spec), params, torch.compiler.is_compiling(),
        )
    return weights, ids
