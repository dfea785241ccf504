"""The FM network (fm_model.py) evaluated with NumPy, for a frozen predictor's inference.

Why: the simulator asks FM about a handful of prefixes per step (one per node that
served), and at that size torch's per-operation dispatch costs more than the
arithmetic: a GRU step alone is about eight ATen calls. NumPy's smaller overhead
makes an env step with FM inside about 1.4x faster (`make bench`). The two agree to
about 1e-6 (float32 sums in another order), which can still flip a near-tie between
two tasks, so the backend is a setting (`PredictorConfig.inference`) and a profile
changes it only together with retraining what reads FM (docs/decisions.md).

Only a frozen network can be mirrored: `NumpyFlow` copies the weights once, so a
predictor whose model is still training (fm_lightning.py) keeps torch.
"""

from __future__ import annotations

import numpy as np

from mara_fm.fm_model import FlowModel


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|, unlike 1/(1 + e^-x)


def _silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


class NumpyFlow:
    """`FlowModel.encode` and `FlowModel.sample` on NumPy arrays, from a snapshot of its weights."""

    def __init__(self, model: FlowModel) -> None:
        w = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
        gru = model.encoder.gru
        if gru.num_layers != 1 or gru.bidirectional or not gru.batch_first:
            raise ValueError("NumpyFlow mirrors a one-layer, one-direction, batch-first GRU only")
        self.hidden = gru.hidden_size
        # Weights stored (in, out) so that every layer is x @ W + b.
        self.gru_in = (w["encoder.gru.weight_ih_l0"].T.copy(), w["encoder.gru.bias_ih_l0"])
        self.gru_rec = (w["encoder.gru.weight_hh_l0"].T.copy(), w["encoder.gru.bias_hh_l0"])
        self.context = [(w[f"context.{i}.weight"].T.copy(), w[f"context.{i}.bias"]) for i in (0, 2)]
        self.freqs = model.field.freqs.detach().cpu().numpy().astype(np.float32)
        self.z_in = (w["field.z_in.weight"].T.copy(), w["field.z_in.bias"])
        self.u_in = w["field.u_in.weight"].T.copy()
        self.c_in = w["field.c_in.weight"].T.copy()
        self.layers = [(w[f"field.hidden.{i}.weight"].T.copy(), w[f"field.hidden.{i}.bias"])
                       for i in range(len(model.field.hidden))]
        self.out = (w["field.out.weight"].T.copy(), w["field.out.bias"])

    def encode(self, points: np.ndarray, counts: np.ndarray, static: np.ndarray) -> np.ndarray:
        """Context c (E, context_dim): the GRU state after each row's last real point, with the
        static features, through the context MLP (gates in torch's order r, z, n)."""
        n_rows, h_dim = len(counts), self.hidden
        gates_in = points @ self.gru_in[0] + self.gru_in[1]  # (E, T, 3H), every step at once
        w_rec, b_rec = self.gru_rec
        h = np.zeros((n_rows, h_dim), np.float32)
        last = np.empty_like(h)
        for t in range(int(counts.max())):
            g_in, g_rec = gates_in[:, t], h @ w_rec + b_rec
            rz = _sigmoid(g_in[:, : 2 * h_dim] + g_rec[:, : 2 * h_dim])
            n = np.tanh(g_in[:, 2 * h_dim :] + rz[:, :h_dim] * g_rec[:, 2 * h_dim :])
            h = n + rz[:, h_dim:] * (h - n)
            ends = counts == t + 1
            last[ends] = h[ends]
        (w1, b1), (w2, b2) = self.context
        return _silu(np.concatenate([last, static], axis=1) @ w1 + b1) @ w2 + b2

    def sample(self, c: np.ndarray, z0: np.ndarray, steps: int) -> np.ndarray:
        """Euler integration from u = 0 to 1 as `FlowModel.sample`: (E, M, H)."""
        n_rows, m = len(c), len(z0)
        angles = (np.arange(steps, dtype=np.float32) / steps)[:, None] * self.freqs
        emb = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
        cond = (emb @ self.u_in + self.z_in[1])[:, None] + (c @ self.c_in)[None]  # (steps, E, width)
        cond = np.repeat(cond, m, axis=1)
        z = np.tile(z0, (n_rows, 1))
        for k in range(steps):
            h = cond[k] + z @ self.z_in[0]
            for w, b in self.layers:
                h = _silu(h) @ w + b
            z = z + (_silu(h) @ self.out[0] + self.out[1]) * np.float32(1.0 / steps)
        return z.reshape(n_rows, m, -1)
