"""The scheduler's mutations of the shared tables, issued on the schedule stream after the barrier.

These are the writes SGLang's scheduler really makes once the barrier lets it (reference notes 2.3
item 4 and 6 item 7). Every value is drawn from a seed, so a run replays exactly. Poison values are
out of range: a late read of one fails loudly (on the CPU) instead of reading plausible data.
"""

from __future__ import annotations

import random

import torch

from harness.case import Mutation
from harness.model.pools import staged, to_device
from harness.world import BatchWorld, gather_len


class Mutator:
    def __init__(self, world: BatchWorld, session, device, *, poison_ok: bool):
        self.world, self.session, self.device = world, session, device
        self.rng = random.Random(world.seed * 7919 + 17)
        self.poison_ok = poison_ok
        self.applied: list[str] = []

    def issue(self, mutations: tuple[Mutation, ...]) -> None:
        for m in mutations:
            getattr(self, "_" + m.kind)(m)

    # -- helpers -----------------------------------------------------------------------------

    def _launch(self, label: str, fn, writes: dict) -> None:
        def run():
            fn()
        self.device.launch(f"scheduler.{label}", run, writes=writes)
        self.applied.append(label)

    def _rows(self, m: Mutation) -> list[int]:
        w = self.world
        pool = list(w.req_pool_idx) if m.target == "batch" and w.req_pool_idx else list(w.spare_rows)
        return self.rng.sample(pool, min(m.count, len(pool)))

    def _window_slots(self, count: int) -> list[int]:
        """Full slots of tokens inside some query's SWA window: what the forward's SWA reads translate."""
        w = self.world
        live = [w.full_slots[r][p] for r, req in enumerate(w.batch.requests)
                for p in range(req.seq_len - gather_len(req, w.dims.swa_window), req.seq_len)]
        return self.rng.sample(live, min(count, len(live))) if live else []

    def _tdev(self):
        return self.device.torch_device

    # -- the mutations -------------------------------------------------------------------------

    def _req_to_token_rewrite(self, m: Mutation) -> None:
        r2t, w = self.session.req_to_token, self.world
        full_size = w.sizes.full_size(w.dims.page_size)
        for row in self._rows(m):
            if m.poison and self.poison_ok:
                values = torch.full((r2t.shape[1],), full_size + 7919, dtype=r2t.dtype)
            else:
                gen = torch.Generator().manual_seed(self.rng.randrange(1 << 30))
                values = torch.randint(1, full_size, (r2t.shape[1],), generator=gen, dtype=r2t.dtype)
            values = to_device(values, self._tdev())
            self._launch(f"req_to_token_rewrite(row={row})", lambda row=row, v=values: r2t[row].copy_(v),
                         {"req_to_token": frozenset({row})})

    def _req_pool_reuse(self, m: Mutation) -> None:
        """A finished request's row goes to a new request: its slots come from spare pages."""
        r2t, w = self.session.req_to_token, self.world
        ps = w.dims.page_size
        pages = list(w.spare_pages) or [0]
        for row in self._rows(m):
            self.rng.shuffle(pages)
            pos = torch.arange(r2t.shape[1])
            values = to_device((torch.tensor(pages)[(pos // ps) % len(pages)] * ps + pos % ps).to(r2t.dtype), self._tdev())
            self._launch(f"req_pool_reuse(row={row})", lambda row=row, v=values: r2t[row].copy_(v),
                         {"req_to_token": frozenset({row})})

    def _swa_clear(self, m: Mutation) -> None:
        f2s = self.session.full_to_swa
        slots = self._window_slots(m.count)
        if slots:
            idx = staged(slots, torch.int64, self._tdev())
            self._launch(f"full_to_swa.index_fill_({len(slots)})", lambda: f2s.index_fill_(0, idx, 0),
                         {"full_to_swa": frozenset(slots)})

    def _swa_repoint(self, m: Mutation) -> None:
        f2s, w = self.session.full_to_swa, self.world
        slots = self._window_slots(m.count)
        if not slots:
            return
        if m.poison and self.poison_ok:
            values = [w.sizes.swa_size + 7919] * len(slots)
        else:
            spare = list(w.spare_swa) or [1]
            values = [self.rng.choice(spare) for _ in slots]
        idx = staged(slots, torch.int64, self._tdev())
        val = staged(values, torch.int64, self._tdev())
        self._launch(f"full_to_swa.repoint({len(slots)})", lambda: f2s.index_copy_(0, idx, val),
                     {"full_to_swa": frozenset(slots)})

    def _kv_realloc(self, m: Mutation) -> None:
        """Free in-window slots (clear their SWA mapping), then hand them to a new request."""
        f2s, r2t, w = self.session.full_to_swa, self.session.req_to_token, self.world
        slots = self._window_slots(m.count)
        if not slots or not w.spare_rows:
            return
        row = self.rng.choice(w.spare_rows)
        spare = list(w.spare_swa) or [1]
        idx = staged(slots, torch.int64, self._tdev())
        val = staged([self.rng.choice(spare) for _ in slots], torch.int64, self._tdev())
        row_vals = staged(slots[: r2t.shape[1]], r2t.dtype, self._tdev())

        def realloc():
            f2s.index_fill_(0, idx, 0)
            f2s.index_copy_(0, idx, val)
            r2t[row, : row_vals.shape[0]].copy_(row_vals)

        self._launch(f"kv_realloc({len(slots)} slots -> row {row})", realloc,
                     {"full_to_swa": frozenset(slots), "req_to_token": frozenset({row})})

    def _batch_rebind(self, m: Mutation) -> None:
        """The next batch reuses the per-batch tensors' storage (what a free without record_stream allows)."""
        fb = self.session.current_batch
        targets = [fb.req_pool_indices, fb.seq_lens, fb.positions, fb.out_cache_loc][: max(1, m.count)]

        def rebind():
            for t in targets:
                t.fill_(0 if not (m.poison and self.poison_ok) else 1 << 20)

        names = ["fb.req_pool_indices", "fb.seq_lens", "fb.positions", "fb.out_cache_loc"][: len(targets)]
        self._launch("batch_rebind", rebind, {n: None for n in names})

    def _hisparse_evict(self, m: Mutation) -> None:
        f2h = self.session.full_to_hisparse
        w = self.world
        blocks = [w.full_slots[r][b * 4] for r, req in enumerate(w.batch.requests) for b in range(req.seq_len // 4)]
        slots = blocks or [s for row in w.full_slots for s in row]  # no block yet: evict plain slots
        slots = self.rng.sample(slots, min(m.count, len(slots)))
        if slots:
            idx = staged(slots, torch.int64, self._tdev())
            self._launch(f"full_to_hisparse.evict({len(slots)})", lambda: f2h.index_fill_(0, idx, 0),
                         {"full_to_hisparse": frozenset(slots)})
