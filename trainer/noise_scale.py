"""The gradient noise scale B_simple = tr(Σ) / |G|² of McCandlish et al. (2018, "An Empirical Model of
Large-Batch Training", appendix A.1), estimated from gradient norms the trainer already has.

Specification. G is the true gradient, Σ the per-sample gradient covariance. A gradient averaged over a batch of
B samples has E|G_B|² = |G|² + tr(Σ)/B. Measuring |G_B|² at two batch sizes B_small < B_big gives the unbiased
estimates

    |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

Without gradient accumulation, |G_small|² is the mean over the W ranks of their local gradients' squared norms
(B_small = the per-rank batch) and |G_big|² the squared norm of the averaged gradient (B_big = W·B_small). With
accumulation (on one process or many) the micro-batches are the small batches and each rank's accumulated
batch the big one (B_big = the per-rank batch), both averaged over the ranks: every number is then local to a
rank and taken before the all-reduce. Norms are taken before any clip and in unscaled units (under fp16 the
loss scale is divided out). With one process and no accumulation there is only one batch size and nothing is
measurable: the estimate is None.

Clipped all-reduces. `before_allreduce` and `bucketwise` average *clipped* local gradients c_r·g_r (per bucket),
so the average of the unclipped ones never exists. It is reconstructed per bucket from scalars: with
M_r = |g_r|², A = Σ_r c_r g_r / W and the cross products s = Σ_{r≠q} <g_r, g_q> that |G_big|² needs,
W²|A|² − Σ_r c_r² M_r = Σ_{r≠q} c_r c_q <g_r, g_q>. Taking the clip-weighted mean of the cross products for
their plain mean gives s ≈ W(W−1)·(W²|A|² − Σ c_r² M_r) / ((Σ c_r)² − Σ c_r²). This is exact when all ranks
have the same coefficient (no clipping: c = 1) and for W = 2 whatever the coefficients. For W > 2 with unequal
coefficients it is a clip-weighted mean, and biased: the clip shrinks most the ranks whose gradient is longest,
which are those whose noise points along G, so |G|² comes out low and B_simple high (+13 % on 4 ranks with
every rank clipped in the least-squares test). Exactness there would need the unclipped average, i.e. a second
gradient all-reduce; accumulating ≥ 2 micro-batches per step avoids the question (see above), and the trainer
says so when it starts in the approximate case.

Smoothing. A single step's |G|² estimate is the small difference of two noisy numbers: it is often near zero
or negative early in training and the ratio tr(Σ)/|G|² of one step is heavy-tailed. As in the paper, the
numerator and the denominator are smoothed separately with bias-corrected exponential moving averages (decay
β, default 0.95: an average over ~20 steps) and B_simple is their ratio, reported as None while the smoothed
|G|² is not positive. It lags the true value by ~1/(1−β) steps and is noisy in the first ones.

Units. Batch sizes count sequences, while the masked-LM loss is the mean over the batch's masked tokens: a
batch's gradient is a token-weighted mean, not a mean over sequences, so B_simple is in sequences only
approximately (a sequence weighs by its masked tokens; the closer the masked-token counts of the sequences, the
closer the two). Under gradient accumulation the "big" batch is one rank's accumulated batch (global batch /
ranks), not the global batch: compare the estimate with B_big, not with the step's global batch.

Where the estimate can be trusted. Against a closed form it comes within 10 % while the true noise scale is at
most about 4x B_big. Far above, the smoothed |G|² is the difference of two nearly equal noisy numbers: the
estimate is heavy-tailed, steps without an estimate (None) become common (20 to 45 % of them) and the median of
the defined ones reads low (0.34 to 0.5x the truth). An estimate above ~4x B_big, or one from a run where many
late steps gave None, is a lower bound, not a value; a larger B_big measures further (hpo's report flags such
estimates).

B_simple is the paper's "simple" noise scale; the critical batch size B_crit equals it only when the Hessian is
a multiple of the identity (they differ by a curvature factor, usually B_crit < B_simple by a small factor).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BucketSums:
    """Sums over ranks for one gradient bucket (or the whole gradient): Σc, Σc², Σc²M, ΣM, and |A|²."""

    coef: float  # Σ_r c_r, the clip coefficients (1 without clipping)
    coef_sq: float  # Σ_r c_r²
    coef_sq_local_sq: float  # Σ_r c_r² |g_r|²
    local_sq: float  # Σ_r |g_r|²
    mean_sq: float  # |A|², A = Σ_r c_r g_r / W: the all-reduced bucket


def two_batch_norms(buckets: list[BucketSums], world: int) -> tuple[float, float]:
    """(|G_small|², |G_big|²) from per-bucket sums over `world` ≥ 2 ranks (see the module docstring)."""
    small = sum(b.local_sq for b in buckets) / world
    cross = 0.0
    for b in buckets:
        weighted_cross = world * world * b.mean_sq - b.coef_sq_local_sq  # Σ_{r≠q} c_r c_q <g_r, g_q>
        cross += world * (world - 1) * weighted_cross / (b.coef * b.coef - b.coef_sq)
    return small, (world * small + cross) / (world * world)


def unbiased_estimates(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(|G|², tr(Σ)) from squared gradient norms at batch sizes b_small < b_big."""
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return grad_sq, trace


@dataclass(frozen=True)
class NoiseScale:
    """One step's report: the smoothed B_simple (None until measurable) and the step's raw squared norms."""

    noise_scale: float | None
    grad_sq_norm_small: float | None
    grad_sq_norm_big: float | None
    batch_small: float | None
    batch_big: float | None

    def record(self) -> dict[str, float | None]:
        """The keys of a progress record."""
        return {
            "noise_scale": self.noise_scale,
            "grad_sq_norm_small": self.grad_sq_norm_small,
            "grad_sq_norm_big": self.grad_sq_norm_big,
        }


NOT_MEASURED = NoiseScale(None, None, None, None, None)


class NoiseScaleEstimator:
    """Bias-corrected EMAs of |G|² and tr(Σ); B_simple = their ratio."""

    def __init__(self, decay: float = 0.95):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay}")
        self.decay = decay
        self.grad_sq = 0.0  # EMA numerators (not yet bias-corrected)
        self.trace = 0.0
        self.weight = 0.0  # 1 - decay^steps: the bias correction

    def update(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> NoiseScale:
        """Add one step's measurement; returns the smoothed noise scale and the raw norms."""
        grad_sq, trace = unbiased_estimates(small_sq, big_sq, b_small, b_big)
        self.grad_sq = self.decay * self.grad_sq + (1.0 - self.decay) * grad_sq
        self.trace = self.decay * self.trace + (1.0 - self.decay) * trace
        self.weight = self.decay * self.weight + (1.0 - self.decay)
        return NoiseScale(self.value(), small_sq, big_sq, b_small, b_big)

    def value(self) -> float | None:
        """tr(Σ)/|G|² of the smoothed estimates; None before any step or while the smoothed |G|² is not positive."""
        if self.weight == 0.0 or self.grad_sq <= 0.0:
            return None
        return (self.trace / self.weight) / (self.grad_sq / self.weight)

    def state_dict(self) -> dict[str, float]:
        return {"grad_sq": self.grad_sq, "trace": self.trace, "weight": self.weight}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.grad_sq, self.trace, self.weight = state["grad_sq"], state["trace"], state["weight"]
