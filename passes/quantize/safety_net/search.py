"""Which quantizers break the output: bisection over the switchable quantizers in graph order (see `search`)."""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

from qcompiler.passes.quantize.safety_net.regions import Tried
from qcompiler.passes.quantize.safety_net.trials import _Trials, db

MAX_FIXES = 16             # groups of quantizers turned float / widened at most
WIDEN_GAP_DB = 3.0         # widen (not float) when 16 bits get within this much of float ...
WIDEN_MARGIN_DB = 6.0      # ... or this much above the floor; members are turned back on while this much above
MIN_GAIN_DB = 0.5          # a fix is kept only when the output SQNR gains at least this much
GROUP_DB_PER_HALVING = 3.0  # a group of n that only hurts together is fixed as one if it gains 3·log2(n) dB


def search(trials: _Trials, k: int, floor: float, wide_bits: Optional[int], no_wide=frozenset(),
           names: Optional[Sequence[str]] = None, tried: Optional[list] = None, noun: str = "quantizers"):
    """Returns ([(indices, "float"|"wide", dB before, dB after)] in the order they were fixed, {index: choice},
    the harm with them fixed). With `tried`, each trial is appended to it (a regions.Tried; `names` label them).

    Each round starts from every quantizer not fixed yet, turned off together (the others as they are): when
    that gains less than MIN_GAIN_DB the rest of the harm is not in activations and the search stops. Otherwise
    the group is halved while one half, turned off alone, removes at least half the noise the group removed;
    when neither half does, the quantizers of the group only hurt together (E[x²] and E[x]² cancelling) and the
    group is fixed as one if it gains GROUP_DB_PER_HALVING·log2(size) dB (else the harm is spread thin over many
    quantizers: the better half is followed while it gains MIN_GAIN_DB, so a 1 dB gain never widens 80 of them);
    the smallest group on the way down that gains that much is the one fixed. A fixed group is widened when 16
    bits get within WIDEN_GAP_DB of float (or above the floor by WIDEN_MARGIN_DB; never one already at 16 bits,
    `no_wide`), else kept float; then its members are turned back on one by one (a trial each,
    within the cap) where the output SQNR stays WIDEN_MARGIN_DB above the floor.
    """
    fixed: Dict[int, str] = {}
    fixes = []

    def label(idx) -> str:
        idx = sorted(idx)
        if names is None:
            return f"{len(idx)} {noun}"
        if len(idx) == 1:
            return f"'{names[idx[0]]}'"
        return f"{len(idx)} {noun} '{names[idx[0]]}' .. '{names[idx[-1]]}' (graph order)"

    def measure(off=(), wide=(), back_on=None):
        off, wide = set(off), set(wide)
        on = [j for j in range(k) if j not in off and fixed.get(j) != "float"]
        w = [j for j in range(k) if (fixed.get(j) == "wide" or j in wide) and j not in off]
        h = trials.harm(on, w)
        if tried is not None and (off or wide or back_on is not None):
            what = label(off or wide) if back_on is None else f"{label([back_on])} back on"
            tried.append(Tried(what, noun, len(off or wide) if back_on is None else 1, db(h),
                               "shrink" if back_on is not None else "wide" if wide else "float"))
        return h

    h_cur = measure()
    while db(h_cur) < floor and trials.left() > 1 and len(fixes) < MAX_FIXES:
        group = [j for j in range(k) if j not in fixed]
        if not group:
            break
        h_g = measure(off=group)
        if not db(h_g) > db(h_cur) + MIN_GAIN_DB:
            break
        def fixable(grp, h):
            return db(h) - db(h_cur) >= max(MIN_GAIN_DB, GROUP_DB_PER_HALVING * math.log2(len(grp)))

        path = [(group, h_g)]
        while len(group) > 1 and trials.left() > 4:
            half = len(group) // 2
            parts = [(measure(off=p), p) for p in (group[:half], group[half:])]
            h_best, best = min(parts, key=lambda t: t[0])
            if (h_cur - h_best) >= 0.5 * (h_cur - h_g):
                group, h_g = best, h_best          # one half carries it
            elif fixable(group, h_g):
                break                              # they hurt together, and enough to be fixed as one
            elif db(h_best) > db(h_cur) + MIN_GAIN_DB:
                group, h_g = best, h_best          # harm spread thin: follow the better half
            else:
                break
            path.append((group, h_g))
        found = [(grp, h) for grp, h in path if fixable(grp, h)]
        if not found:
            break
        group, h_g = list(found[-1][0]), found[-1][1]   # the smallest group on the way that is worth fixing
        choice, h_new = "float", h_g
        if wide_bits and not no_wide.intersection(group) and trials.left() > 1:
            h_w = measure(wide=group)
            if db(h_w) >= min(db(h_g) - WIDEN_GAP_DB, floor + WIDEN_MARGIN_DB):
                choice, h_new = "wide", h_w
        for j in group:
            fixed[j] = choice
        if len(group) > 1:
            for j in list(group):
                if trials.left() < 2 or len(group) == 1:
                    break
                del fixed[j]
                h_try = measure(back_on=j)
                if db(h_try) >= max(floor + WIDEN_MARGIN_DB, db(h_cur) + MIN_GAIN_DB):
                    group.remove(j)
                    h_new = h_try
                else:
                    fixed[j] = choice
        fixes.append((group, choice, db(h_cur), db(h_new)))
        if tried is not None:
            tried.append(Tried(label(group), noun, len(group), db(h_new), choice, kept=True))
        h_cur = h_new
    return fixes, fixed, h_cur

