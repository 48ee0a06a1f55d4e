"""Two rule-made languages for the demo's translators, and the sentence pairs they learn from.

English sentences come from one small grammar: subject, verb, object; each noun phrase an
optional article, an optional adjective and a noun, singular or plural; the verb present or
past. Each invented language has its own lexicon, word order and inflections:

- **Zorbish**: subject–object–verb; the adjective after its noun; "the" is ``lo`` and "a"
  is dropped; plural nouns take ``-en``; verbs take ``-a`` (present) or ``-ot`` (past).
- **Kelvic**: verb–subject–object; the adjective before its noun; "the" is ``ha`` and "a"
  is ``un``; plural nouns take the prefix ``ta``; the past is the particle ``su`` before
  the verb.

So "the big dogs watched a cat" is ``lo bakumen grav mirel vedot`` in Zorbish and
``su vedra ha stor tahund un kat`` in Kelvic. A translator that learned the rules
translates sentences it never saw; the held-out sentences test exactly that.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Dict, List, Tuple

NOUNS = ("dog", "cat", "bird", "farmer", "teacher", "king", "horse", "friend", "baker", "sailor", "doctor", "girl")
ADJECTIVES = ("big", "small", "old", "young", "happy", "red")
VERBS = ("like", "help", "follow", "watch", "call", "push", "visit", "greet")

NounPhrase = Tuple[str, str, str, bool]  # article ("the", "a", ""), adjective or "", noun, plural
Sentence = Tuple[NounPhrase, str, bool, NounPhrase]  # subject, verb, past, object


@dataclass(frozen=True)
class Language:
    name: str
    lexicon: Dict[str, str]
    articles: Dict[str, str]
    order: str  # "SOV" or "VSO"
    adjective_first: bool
    plural: Tuple[str, str]  # (prefix, suffix) of a plural noun
    tense: Dict[bool, Tuple[str, str]]  # past? -> (particle before the verb, suffix)

    def noun_phrase(self, phrase: NounPhrase) -> List[str]:
        article, adjective, noun, plural = phrase
        prefix, suffix = self.plural if plural else ("", "")
        words = [prefix + self.lexicon[noun] + suffix]
        if adjective:
            words.insert(0 if self.adjective_first else 1, self.lexicon[adjective])
        return [w for w in (self.articles[article],) if w] + words

    def verb(self, verb: str, past: bool) -> List[str]:
        particle, suffix = self.tense[past]
        return [w for w in (particle, self.lexicon[verb] + suffix) if w]

    def translate(self, sentence: Sentence) -> str:
        subject, verb, past, obj = sentence
        parts = {"S": self.noun_phrase(subject), "V": self.verb(verb, past), "O": self.noun_phrase(obj)}
        return " ".join(w for slot in self.order for w in parts[slot])


ZORBISH = Language(
    "Zorbish",
    dict(
        zip(
            NOUNS + ADJECTIVES + VERBS,
            (
                "bakum",
                "mirel",
                "tasko",
                "dorin",
                "velum",
                "kazor",
                "pondu",
                "rimak",
                "sulto",
                "nerav",
                "gobel",
                "lisha",
                "grav",
                "pim",
                "olt",
                "yun",
                "feli",
                "rud",
                "hom",
                "bas",
                "fol",
                "ved",
                "kar",
                "pus",
                "vis",
                "gren",
            ),
        )
    ),
    {"the": "lo", "a": "", "": ""},
    "SOV",
    adjective_first=False,
    plural=("", "en"),
    tense={False: ("", "a"), True: ("", "ot")},
)
KELVIC = Language(
    "Kelvic",
    dict(
        zip(
            NOUNS + ADJECTIVES + VERBS,
            (
                "hund",
                "kat",
                "fogel",
                "bur",
                "lerer",
                "konge",
                "hest",
                "ven",
                "beker",
                "sjoman",
                "lege",
                "pike",
                "stor",
                "lit",
                "gam",
                "ung",
                "glad",
                "rod",
                "lik",
                "hjel",
                "folg",
                "vedra",
                "rop",
                "skub",
                "besok",
                "hils",
            ),
        )
    ),
    {"the": "ha", "a": "un", "": ""},
    "VSO",
    adjective_first=True,
    plural=("ta", ""),
    tense={False: ("", ""), True: ("su", "")},
)
LANGUAGES = {"zorbish": ZORBISH, "kelvic": KELVIC}


def english(sentence: Sentence) -> str:
    def phrase(p: NounPhrase) -> List[str]:
        article, adjective, noun, plural = p
        return [w for w in (article, adjective, noun + ("s" if plural else "")) if w]

    subject, verb, past, obj = sentence
    third_singular = not subject[3]
    inflected = verb + (
        "ed"
        if past and not verb.endswith("e")
        else "d"
        if past
        else "es"
        if verb.endswith(("sh", "ch")) and third_singular
        else "s"
        if third_singular
        else ""
    )
    return " ".join(phrase(subject) + [inflected] + phrase(obj))


def sentences(rng: random.Random) -> "iter[Sentence]":
    """An endless stream of random sentences of the grammar."""

    def phrase() -> NounPhrase:
        plural = rng.random() < 0.3
        article = rng.choice(("the", "") if plural else ("the", "the", "a"))
        adjective = rng.choice(ADJECTIVES) if rng.random() < 0.5 else ""
        return article, adjective, rng.choice(NOUNS), plural

    while True:
        subject, obj = phrase(), phrase()
        if subject[2] != obj[2]:
            yield subject, rng.choice(VERBS), rng.random() < 0.5, obj


def prompt(language: Language, text: str) -> str:
    return f"Translate into {language.name}: {text}\n{language.name}:"


# expert name → (language, English sentence set); zorbish_a and kelvic_a share their English
EXPERTS = {"zorbish_a": ("zorbish", "a"), "kelvic_a": ("kelvic", "a"), "zorbish_b": ("zorbish", "b")}


def rows(train: int = 320, test: int = 40, seed: int = 0) -> List[dict]:
    """The demo's translation data: for each sentence set ("a", "b") ``train`` sentences to
    learn from and ``test`` held out, all distinct (no test sentence is in any training set)."""
    stream, seen = sentences(random.Random(seed)), set()
    sets: Dict[str, Dict[str, List[Sentence]]] = {}
    for name in ("a", "b"):
        sets[name] = {}
        for split, count in (("train", train), ("test", test)):
            chosen = []
            while len(chosen) < count:
                sentence = next(stream)
                if english(sentence) not in seen:
                    seen.add(english(sentence))
                    chosen.append(sentence)
            sets[name][split] = chosen
    out = []
    for expert, (language, which) in EXPERTS.items():
        lang = LANGUAGES[language]
        for split in ("train", "test"):
            for sentence in sets[which][split]:
                out.append(
                    {
                        "expert": expert,
                        "language": lang.name,
                        "split": split,
                        "prompt": prompt(lang, english(sentence)),
                        "answer": lang.translate(sentence),
                    }
                )
    return out


def jsonl(data: List[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in data)
