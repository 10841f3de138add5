"""A small synthetic language, generated on the fly, so the demo needs no downloads.

Documents come from a seeded probabilistic grammar with structure at several ranges:
  local      determiner/number agreement, Zipf-distributed word choice, verb -> preferred objects
  sentence   subject-verb number agreement across an optional bracketed relative clause
  document   a topic token after <bos> picks the nouns and verbs of the whole document; objects
             sometimes repeat the previous sentence's subject (copying from far back)

Every token is drawn from an explicit distribution whose state is readable from the tokens seen so far
(all choices emit distinct tokens), so the generator also reports the exact conditional entropy of what
it emits: the best loss any model can reach with the full document in view.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

# Fixed vocabulary layout. The grammar itself (word preferences) comes from LANGUAGE_SEED, so every run
# and every --seed sees the same language; --seed only changes which sentences are sampled.
LANGUAGE_SEED = 20261129
SPECIALS = ["<bos>", ".", "(", ")", "and", "that", "the", "a", "some", "every"]
N_TOPICS = 4
N_ADJ = 12
NOUNS_PER_TOPIC = 8
VERBS_PER_TOPIC = 6

_SING_DETS = ("the", "a", "every")
_PLUR_DETS = ("the", "some")


def _zipf(n: int, s: float = 1.1) -> list[float]:
    w = [1.0 / (i + 1) ** s for i in range(n)]
    z = sum(w)
    return [x / z for x in w]


class _Dist:
    """A categorical distribution over token ids with O(log n) sampling and exact log-probabilities."""

    def __init__(self, probs: dict[int, float]):
        self.probs = probs
        self.ids = list(probs)
        self.cum = []
        acc = 0.0
        for t in self.ids:
            acc += probs[t]
            self.cum.append(acc)

    def sample(self, rng: random.Random) -> int:
        u = rng.random() * self.cum[-1]
        lo, hi = 0, len(self.cum) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cum[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return self.ids[lo]


def _mix(a: dict[int, float], b: dict[int, float], wa: float) -> dict[int, float]:
    out = {t: wa * p for t, p in a.items()}
    for t, p in b.items():
        out[t] = out.get(t, 0.0) + (1.0 - wa) * p
    return out


@dataclass(frozen=True)
class GrammarParams:
    p_off_topic: float = 0.1  # a noun/verb drawn from any topic instead of the document's
    p_adj: float = 0.35  # another adjective before the noun (geometric)
    p_rel: float = 0.25  # subject gets a bracketed relative clause "( that VERB ... )"
    p_obj: float = 0.7  # a verb takes an object
    p_copy: float = 0.3  # the object repeats the previous sentence's subject noun
    p_plural: float = 0.4
    p_and: float = 0.2  # coordinated second verb phrase
    p_end_doc: float = 0.15  # after each sentence (geometric number of sentences)


class SyntheticLanguage:
    """Token ids and the grammar. `sample_document` returns (tokens, sum of -log p over its tokens)."""

    def __init__(self, params: GrammarParams = GrammarParams()):
        self.p = params
        words = list(SPECIALS)
        words += [f"<topic{t}>" for t in range(N_TOPICS)]
        words += [f"adj{i}" for i in range(N_ADJ)]
        self.noun = {}  # (topic, stem, plural) -> id
        self.verb = {}
        for t in range(N_TOPICS):
            for s in range(NOUNS_PER_TOPIC):
                for pl in (0, 1):
                    self.noun[(t, s, pl)] = len(words)
                    words.append(f"n{t}.{s}{'s' if pl else ''}")
            for s in range(VERBS_PER_TOPIC):
                for pl in (0, 1):
                    self.verb[(t, s, pl)] = len(words)
                    words.append(f"v{t}.{s}{'' if pl else 's'}")
        self.words = words
        self.vocab_size = len(words)
        self.id = {w: i for i, w in enumerate(words)}
        self.noun_info = {i: k for k, i in self.noun.items()}
        self.verb_info = {i: k for k, i in self.verb.items()}

        rng = random.Random(LANGUAGE_SEED)
        zn, zv, za = _zipf(NOUNS_PER_TOPIC), _zipf(VERBS_PER_TOPIC), _zipf(N_ADJ)
        self.adj_dist = _Dist({self.id[f"adj{i}"]: za[i] for i in range(N_ADJ)})
        self.topic_dist = _Dist({self.id[f"<topic{t}>"]: 1.0 / N_TOPICS for t in range(N_TOPICS)})
        # Subject nouns and verbs: Zipf within the topic (each topic ranks its stems differently, both
        # numbers alike), mixed with a uniform draw from every topic.
        self._subj, self._verb, self._obj = {}, {}, {}
        n_order = {t: rng.sample(range(NOUNS_PER_TOPIC), NOUNS_PER_TOPIC) for t in range(N_TOPICS)}
        v_order = {t: rng.sample(range(VERBS_PER_TOPIC), VERBS_PER_TOPIC) for t in range(N_TOPICS)}
        for pl in (0, 1):
            any_noun = {self.noun[(t, s, pl)]: 1.0 / (N_TOPICS * NOUNS_PER_TOPIC)
                        for t in range(N_TOPICS) for s in range(NOUNS_PER_TOPIC)}
            any_verb = {self.verb[(t, s, pl)]: 1.0 / (N_TOPICS * VERBS_PER_TOPIC)
                        for t in range(N_TOPICS) for s in range(VERBS_PER_TOPIC)}
            for t in range(N_TOPICS):
                on = {self.noun[(t, s, pl)]: zn[r] for r, s in enumerate(n_order[t])}
                self._subj[(t, pl)] = _Dist(_mix(on, any_noun, 1 - params.p_off_topic))
                ov = {self.verb[(t, s, pl)]: zv[r] for r, s in enumerate(v_order[t])}
                self._verb[(t, pl)] = _Dist(_mix(ov, any_verb, 1 - params.p_off_topic))
        # Each verb stem prefers a few object nouns (selectional preference), of either number.
        for t in range(N_TOPICS):
            for s in range(VERBS_PER_TOPIC):
                pref = rng.sample(range(NOUNS_PER_TOPIC), NOUNS_PER_TOPIC)
                for opl in (0, 1):
                    o = {self.noun[(t, n, opl)]: zn[r] ** 2 for r, n in enumerate(pref)}
                    z = sum(o.values())
                    self._obj[(t, s, opl)] = _Dist({k: v / z for k, v in o.items()})
        self._dets = {pl: _Dist({self.id[d]: 1.0 / len(ds) for d in ds})
                      for pl, ds in ((0, _SING_DETS), (1, _PLUR_DETS))}

    # -- sampling ------------------------------------------------------------------------------------
    def sample_document(self, rng: random.Random) -> tuple[list[int], float]:
        # The derivation of a document is unique given its tokens (every decision emits a distinct
        # token, and where two derivations give the same token -- copied vs freshly drawn object -- the
        # token is drawn from the mixture), so -log P(document) is the sum of -log P(decision).
        p = self.p
        out: list[int] = []
        nll = 0.0

        def decide(prob_true: float) -> bool:
            nonlocal nll
            yes = rng.random() < prob_true
            nll -= math.log(prob_true if yes else 1.0 - prob_true)
            return yes

        def draw(dist: _Dist) -> int:
            nonlocal nll
            tok = dist.sample(rng)
            nll -= math.log(dist.probs[tok])
            out.append(tok)
            return tok

        def emit(tok: int) -> None:
            out.append(tok)

        def noun_phrase(pl: int, nouns: _Dist) -> int:
            draw(self._dets[pl])
            while decide(p.p_adj):
                draw(self.adj_dist)
            return draw(nouns)

        def verb_phrase(pl: int, prev_subj: int | None) -> None:
            v = draw(self._verb[(topic, pl)])
            vt, vs, _ = self.verb_info[v]
            if decide(p.p_obj):
                opl = 1 if decide(p.p_plural) else 0
                nouns = self._obj[(vt, vs, opl)]
                if prev_subj is not None and self.noun_info[prev_subj][2] == opl:
                    nouns = _Dist(_mix({prev_subj: 1.0}, nouns.probs, p.p_copy))
                noun_phrase(opl, nouns)

        emit(self.id["<bos>"])
        topic = draw(self.topic_dist) - self.id["<topic0>"]
        prev_subj: int | None = None
        while True:
            pl = 1 if decide(p.p_plural) else 0
            subj = noun_phrase(pl, self._subj[(topic, pl)])
            if decide(p.p_rel):
                emit(self.id["("])
                emit(self.id["that"])
                verb_phrase(pl, prev_subj)
                emit(self.id[")"])
            verb_phrase(pl, prev_subj)
            if decide(p.p_and):
                emit(self.id["and"])
                verb_phrase(pl, prev_subj)
            emit(self.id["."])
            prev_subj = subj
            if decide(p.p_end_doc):
                return out, nll

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)


def token_stream(lang: SyntheticLanguage, n_tokens: int, seed: int) -> tuple[torch.Tensor, float]:
    """Concatenated documents, exactly n_tokens long, and the source entropy in nats/token."""
    rng = random.Random(seed)
    toks: list[int] = []
    nll = 0.0
    while len(toks) < n_tokens:
        doc, doc_nll = lang.sample_document(rng)
        toks.extend(doc)
        nll += doc_nll
    n = len(toks)
    return torch.tensor(toks[:n_tokens], dtype=torch.long), nll / n


def make_batches(lang: SyntheticLanguage, steps: int, batch_size: int, seq_len: int, seed: int):
    """(steps, batch, seq_len + 1) token windows in a fixed order, plus the source entropy."""
    need = steps * batch_size * (seq_len + 1)
    stream, entropy = token_stream(lang, need, seed)
    return stream.view(steps, batch_size, seq_len + 1), entropy
