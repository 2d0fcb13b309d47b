"""Bounded mode rides out a stall (issue 43): a rank that fell more than a window behind
rejoins instead of ending the job.

A bounded-mode rank that stops for a while (a GC pause, a preemption: SIGSTOP in the
test) finds, when it runs again, that the switch has reused the slots of the results it
missed (``AllreduceTooLate``: a STALE answer, or a result gone past its give-up time).
Before, that ended the job. (A STALE answer makes the rank behind even when the
results it missed still wait in its receive buffer, ``sockbuf.WORKER_RCVBUF``: its DATA
would go on being too late until it rejoins. The client takes the answer whichever
datagram it reads first and also after the call it answers:
``AllreduceCall.stale_behind``.) Now the rank:

1. marks itself *behind* (``InaHookState.behind``): the rest of its step skips the
   switch (its gradients are not sent; what its optimizer applies is overwritten below);
2. asks every rank, through the process group's store, for a *rejoin round*;
3. every rank, at its next step boundary, says which step it is at; the highest step
   is the meeting step, and the lowest rank there that is not behind is the *donor*;
4. the ranks below the meeting step (the behind one, and any that were slower) step on
   without the switch until they reach it; the donor waits there;
5. the donor puts its replica (parameters and optimizer state: the sum of every result
   it applied, the same bytes every other in-step rank applied) and its position in
   the job's sequence into the store; every other rank loads them, and every rank's
   client starts at that position (``SwitchClient.start``); they wait for each other
   and go on, with replicas bitwise identical.

The stalled rank loses the steps it missed (its own data of those steps is not
trained on, as a bounded slot closed without it loses its contribution); the others
lose the time the round takes. A rank that cannot complete a round within ``giveup``
seconds (a peer gone, the store unreachable) raises ``AllreduceTooLate``, which ends
the job, as before. The store costs one round trip per step (a counter read).
"""

from datetime import timedelta
import io
import time

__all__ = ["Rejoin", "REJOIN_GIVEUP_S"]

#: seconds a rank waits for a rejoin round to complete (INA_REJOIN_S) before ending
REJOIN_GIVEUP_S = 30.0
_KEY = "ina/rejoin"
#: the replica goes through the store in pieces of this size (a TCPStore value is at
#: most 8 MiB)
_PIECE = 4 << 20


class Rejoin:
    """The rejoin rounds of one rank (the module's docstring). ``after_step`` is called
    after every optimizer step, on every rank, with the step count."""

    def __init__(self, store, rank, world, state, model, opt, giveup=REJOIN_GIVEUP_S):
        self.store, self.rank, self.world = store, rank, world
        self.state, self.model, self.opt = state, model, opt
        self.giveup = giveup
        self.round = 0          # rounds completed
        self.meet = None        # (round, meeting step, donor) of the round under way
        self.rejoins = 0        # rounds in which this rank took a donor's replica
        self.steps_skipped = 0  # steps this rank took without the switch (behind)
        self.seconds = 0.0      # time spent in rounds
        self._asked = False

    def after_step(self, step: int):
        st = self.state
        if st.behind:
            self.steps_skipped += 1
            if not self._asked:
                self._asked = True
                self.store.add(f"{_KEY}/n", 1)
        if self.meet is None:
            if int(self.store.add(f"{_KEY}/n", 0)) <= self.round:
                return
            self._join(step)
        r, meet, donor = self.meet
        if step < meet:
            st.behind = True            # catch up without the switch
            return
        self._transfer(r, meet, donor)

    def finish(self, step: int):
        """At the end of training (every rank stops at the same step): complete the
        rounds still asked for, so no rank waits for one that left."""
        while self.meet is not None or int(self.store.add(f"{_KEY}/n", 0)) > self.round:
            if self.meet is None:
                self._join(step)
            r, meet, donor = self.meet
            if step < meet:
                from ..transport.switch_client import AllreduceTooLate
                raise AllreduceTooLate(f"rank {self.rank}: training ended at step {step}, "
                                       f"before rejoin round {r}'s step {meet}")
            self._transfer(r, meet, donor)

    # -- a round ---------------------------------------------------------------------
    def _wait(self, keys, what):
        try:
            self.store.wait(keys, timedelta(seconds=self.giveup))
        except Exception as e:  # noqa: BLE001 (the store's timeout or a closed store)
            from ..transport.switch_client import AllreduceTooLate
            raise AllreduceTooLate(
                f"rank {self.rank}: bounded mode, could not rejoin the job within "
                f"{self.giveup:g}s ({what}: {type(e).__name__}: {e}); ending the job "
                f"(INA_REJOIN_S sets the give-up time)") from None

    def _join(self, step):
        t = time.perf_counter()
        r = self.round + 1
        self.store.set(f"{_KEY}/{r}/at/{self.rank}", f"{step},{int(self.state.behind)}")
        keys = [f"{_KEY}/{r}/at/{k}" for k in range(self.world)]
        self._wait(keys, "every rank's step")
        at = [tuple(map(int, self.store.get(k).decode().split(","))) for k in keys]
        meet = max(s for s, _ in at)
        donors = [k for k, (s, b) in enumerate(at) if s == meet and not b]
        if not donors:
            from ..transport.switch_client import AllreduceTooLate
            raise AllreduceTooLate(f"rank {self.rank}: bounded mode, every rank at step "
                                   f"{meet} is behind: no replica to rejoin from")
        self.meet = (r, meet, donors[0])
        self.seconds += time.perf_counter() - t

    def _transfer(self, r, meet, donor):
        import torch
        t = time.perf_counter()
        c = self.state.collective
        if self.rank == donor:
            buf = io.BytesIO()
            torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                        "seq": c.seq, "session": c.session, "step": meet}, buf)
            data = buf.getvalue()
            pieces = range(0, len(data), _PIECE)
            for i, a in enumerate(pieces):
                self.store.set(f"{_KEY}/{r}/replica/{i}", data[a:a + _PIECE])
            self.store.set(f"{_KEY}/{r}/replica", str(len(pieces)))
        else:
            self._wait([f"{_KEY}/{r}/replica"], f"the replica of rank {donor}")
            n = int(self.store.get(f"{_KEY}/{r}/replica").decode())
            data = b"".join(self.store.get(f"{_KEY}/{r}/replica/{i}") for i in range(n))
            doc = torch.load(io.BytesIO(data), weights_only=False)
            if doc["step"] != meet:
                raise RuntimeError(f"rejoin round {r}: replica of step {doc['step']}, "
                                   f"expected {meet}")
            self.model.load_state_dict(doc["model"])
            self.opt.load_state_dict(doc["opt"])
            c.start(doc["session"], doc["seq"])
            self.rejoins += 1
        self.state.behind = False
        self._asked = False
        self.store.set(f"{_KEY}/{r}/done/{self.rank}", "1")
        self._wait([f"{_KEY}/{r}/done/{k}" for k in range(self.world)], "every rank loaded")
        if self.rank == donor:          # every rank has it: free the store's copy
            try:
                n = int(self.store.get(f"{_KEY}/{r}/replica").decode())
                for i in range(n):
                    self.store.delete_key(f"{_KEY}/{r}/replica/{i}")
            except Exception:  # noqa: BLE001 (a store without delete: it stays)
                pass
        self.round, self.meet = r, None
        self.seconds += time.perf_counter() - t
