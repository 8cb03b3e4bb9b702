"""A constrained row's walk through its action trie, a decision at a time: the tokens the trie forces appended
without a draw, a draw where it allows a choice, and with jump-forward the run of forced tokens after each draw.
What every sampler shares (`sdar.agent.decoding`'s decode loop and `sdar.agent.lookahead`'s one packed forward),
and what a sampled row comes out as (`Decoded`, with the sampler's `DecodeStats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Decoded:
    """One row: its tokens (ending with EOS when it finished), their log-probs (0 at forced tokens),
    whether it finished, and how many of its tokens were forced."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    forced: int


@dataclass
class DecodeStats:
    """forwards: model calls after the prefill; tokens: tokens appended; forced: of them, forced;
    prefill_tokens: positions the prefill ran through the model (padding included)."""

    forwards: int = 0
    tokens: int = 0
    forced: int = 0
    prefill_tokens: int = 0


def forced_run(trie, toks: list[int], eos: set[int], max_new_tokens: int) -> list[int]:
    """The tokens the trie forces one after another after `toks` (none after EOS, none past max_new_tokens)."""
    run: list[int] = []
    while trie is not None and toks and toks[-1] not in eos and len(toks) + len(run) < max_new_tokens:
        nxt = trie.allowed(toks + run)
        if len(nxt) != 1:
            break
        run.append(nxt[0])
        if nxt[0] in eos:
            break
    return run


class RowWalk:
    """Each row's response so far, a step at a time: the forced tokens the trie allows alone, a draw for the rest
    (every deciding row of a step in one call), then with jump_forward the run of forced tokens after each."""

    def __init__(self, n: int, tries: list, eos: set[int], max_new_tokens: int, jump_forward: bool) -> None:
        self.tries, self.eos, self.max_new, self.jump = tries, eos, max_new_tokens, jump_forward
        self.toks: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.forced = [0] * n
        self.done = [False] * n

    def step(self, draw) -> list[list[int]] | None:
        """Append each live row's next chunk; `draw(rows, allowed sets)` decides the rows with a choice (a set of
        two or more tokens, or None: any token). Returns the chunks the next forward feeds ([] for a finished
        row), None once every row is done."""
        live = [i for i, d in enumerate(self.done) if not d]
        chunks: dict[int, list[int]] = {}
        need, sets = [], []
        for i in live:
            allowed = self.tries[i].allowed(self.toks[i]) if self.tries[i] is not None else None
            if allowed is not None and len(allowed) == 1:
                chunks[i] = [allowed[0]]
                self.lps[i].append(0.0)
                self.forced[i] += 1
            else:
                need.append(i)
                sets.append(allowed or None)
        if need:
            for i, tok, lp in zip(need, *draw(need, sets)):
                chunks[i] = [tok]
                self.lps[i].append(lp)
        out: list[list[int]] = [[] for _ in self.done]
        for i in live:
            chunk = chunks[i]
            if self.jump:
                run = forced_run(self.tries[i], self.toks[i] + chunk, self.eos, self.max_new)
                chunk += run
                self.lps[i] += [0.0] * len(run)
                self.forced[i] += len(run)
            self.toks[i] += chunk
            if chunk[-1] in self.eos or len(self.toks[i]) >= self.max_new:
                self.done[i] = True
            else:
                out[i] = chunk
        return None if all(self.done) else out

    def decoded(self, st: DecodeStats) -> list[Decoded]:
        st.forced += sum(self.forced)
        st.tokens += sum(len(t) for t in self.toks)
        return [Decoded(t, lp, bool(t) and t[-1] in self.eos, f) for t, lp, f in zip(self.toks, self.lps, self.forced)]
