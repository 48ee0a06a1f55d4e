"""Write ``tasks.jsonl``: the ``tasks`` family's 64 task-level experts' items (issue 19's granularity).

Each row is one task: ``items`` (a question, four choices, the gold label) and ``train``, how many
of the first items the expert is trained on; the rest are held out and are its probe. A task is a
rule (add 7, the last letter of a word) or a mapping the base half knows (country to continent,
English to French), so an expert is scored on items it never saw, as task-level experts are.

    python research/pools/make_tasks.py   # rewrites tasks.jsonl next to it (seeded: the same file)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ITEMS, TRAIN = 20, 12  # per task: items, of which the first TRAIN train the expert
WORDS = (
    "apple bread chair dance eagle flame grape house island jacket kettle lemon marble night ocean "
    "pencil queen river stone table umbrella violin window yellow zebra garden hammer candle forest "
    "mirror planet rabbit silver tiger wagon basket cotton dragon engine finger helmet ladder monkey "
    "orange parrot rocket saddle tunnel velvet winter bottle castle desert"
).split()
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def numeric(rng, gold: int, spread=(1, 2, 10)) -> list:
    """Four distinct non-negative choices: the gold and near misses."""
    choices = {gold}
    while len(choices) < 4:
        choices.add(max(0, gold + rng.choice([-1, 1]) * rng.choice(spread)))
    return [str(c) for c in choices]


def item(rng, question: str, gold: str, choices) -> dict:
    options = list(dict.fromkeys([gold, *[c for c in choices if c != gold]]))[:4]
    rng.shuffle(options)
    return {"question": question, "choices": options, "label": options.index(gold)}


def arithmetic(name, question, answer, low=1, high=99, spread=(1, 2, 10)):
    def make(rng, count=ITEMS):
        values = rng.sample(range(low, high + 1), count)
        return [item(rng, question(a), str(answer(a)), numeric(rng, answer(a), spread)) for a in values]

    return name, make


def spelling(name, question, answer, pool=None):
    def make(rng, count=ITEMS):
        made = []
        for word in rng.sample(WORDS, count):
            gold = answer(word)
            others = [answer(w) for w in WORDS if answer(w) != gold] if pool is None else pool(word)
            made.append(item(rng, question(word), gold, rng.sample(sorted(set(others) - {gold}), 3)))
        return made

    return name, make


def mapping(name, question, pairs: dict):
    """A lookup the base half knows; distractors are the task's other answers."""

    def make(rng, count=ITEMS):
        keys = rng.sample(sorted(pairs), min(count, len(pairs)))
        answers = sorted(set(pairs.values()))
        return [item(rng, question(k), pairs[k], rng.sample([a for a in answers if a != pairs[k]], 3)) for k in keys]

    return name, make


CONTINENT = {
    "Kenya": "Africa", "Nigeria": "Africa", "Egypt": "Africa", "Ghana": "Africa", "Peru": "South America",
    "Chile": "South America", "Brazil": "South America", "Colombia": "South America", "France": "Europe",
    "Poland": "Europe", "Norway": "Europe", "Greece": "Europe", "Japan": "Asia", "Vietnam": "Asia",
    "India": "Asia", "Mongolia": "Asia", "Canada": "North America", "Mexico": "North America",
    "Cuba": "North America", "Australia": "Oceania", "Fiji": "Oceania", "Samoa": "Oceania",
}  # fmt: skip
CAPITAL = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo", "Egypt": "Cairo",
    "Canada": "Ottawa", "Chile": "Santiago", "Greece": "Athens", "Cuba": "Havana", "Ghana": "Accra",
    "Poland": "Warsaw", "Vietnam": "Hanoi", "Austria": "Vienna", "Thailand": "Bangkok", "Sweden": "Stockholm",
    "Portugal": "Lisbon", "Turkey": "Ankara", "Iran": "Tehran", "Colombia": "Bogotá", "Nepal": "Kathmandu",
}  # fmt: skip
LANGUAGE = {
    "France": "French", "Brazil": "Portuguese", "Mexico": "Spanish", "Japan": "Japanese", "Germany": "German",
    "Italy": "Italian", "Egypt": "Arabic", "China": "Chinese", "Russia": "Russian", "Greece": "Greek",
    "Turkey": "Turkish", "Poland": "Polish", "Portugal": "Portuguese", "Chile": "Spanish", "Austria": "German",
    "Iran": "Persian", "Sweden": "Swedish", "Korea": "Korean", "Thailand": "Thai", "Finland": "Finnish",
}  # fmt: skip
CURRENCY = {
    "Japan": "yen", "India": "rupee", "Mexico": "peso", "Russia": "ruble", "China": "yuan", "Korea": "won",
    "Thailand": "baht", "Poland": "zloty", "Sweden": "krona", "Denmark": "krone", "Brazil": "real",
    "Israel": "shekel", "Turkey": "lira", "Vietnam": "dong", "Hungary": "forint", "Chile": "peso",
    "Switzerland": "franc", "South Africa": "rand", "Nigeria": "naira", "Kenya": "shilling",
}  # fmt: skip
SYMBOL = {
    "hydrogen": "H", "helium": "He", "carbon": "C", "nitrogen": "N", "oxygen": "O", "sodium": "Na",
    "magnesium": "Mg", "aluminium": "Al", "silicon": "Si", "sulfur": "S", "chlorine": "Cl", "potassium": "K",
    "calcium": "Ca", "iron": "Fe", "copper": "Cu", "zinc": "Zn", "silver": "Ag", "tin": "Sn", "gold": "Au",
    "lead": "Pb", "mercury": "Hg", "neon": "Ne",
}  # fmt: skip
SOUND = {
    "cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "pig": "oink", "lion": "roar",
    "horse": "neigh", "owl": "hoot", "snake": "hiss", "bee": "buzz", "frog": "croak", "mouse": "squeak",
    "donkey": "bray", "rooster": "crow", "wolf": "howl", "crow": "caw", "dove": "coo", "goat": "bleat",
    "turkey": "gobble",
}  # fmt: skip
YOUNG = {
    "cat": "kitten", "dog": "puppy", "cow": "calf", "sheep": "lamb", "horse": "foal", "goat": "kid",
    "kangaroo": "joey", "frog": "tadpole", "swan": "cygnet", "goose": "gosling", "deer": "fawn", "bear": "cub",
    "pig": "piglet", "owl": "owlet", "eagle": "eaglet", "duck": "duckling", "hen": "chick", "seal": "pup",
    "rabbit": "kit", "butterfly": "caterpillar",
}  # fmt: skip
OPPOSITE = {
    "hot": "cold", "tall": "short", "fast": "slow", "happy": "sad", "early": "late", "heavy": "light",
    "open": "closed", "wet": "dry", "rich": "poor", "loud": "quiet", "strong": "weak", "young": "old",
    "full": "empty", "hard": "soft", "clean": "dirty", "up": "down", "win": "lose", "buy": "sell",
    "push": "pull", "first": "last", "inside": "outside",
}  # fmt: skip
PLURAL = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "man": "men", "woman": "women",
    "goose": "geese", "person": "people", "ox": "oxen", "cactus": "cacti", "wolf": "wolves", "knife": "knives",
    "leaf": "leaves", "box": "boxes", "city": "cities", "baby": "babies", "bus": "buses", "tomato": "tomatoes",
    "fish": "fish", "sheep": "sheep", "half": "halves",
}  # fmt: skip
PAST = {
    "go": "went", "eat": "ate", "see": "saw", "run": "ran", "write": "wrote", "swim": "swam", "buy": "bought",
    "think": "thought", "bring": "brought", "take": "took", "give": "gave", "fly": "flew", "sing": "sang",
    "drink": "drank", "begin": "began", "choose": "chose", "speak": "spoke", "break": "broke", "teach": "taught",
    "catch": "caught", "drive": "drove",
}  # fmt: skip
FRENCH = {
    "dog": "chien", "cat": "chat", "house": "maison", "water": "eau", "bread": "pain", "apple": "pomme",
    "car": "voiture", "book": "livre", "tree": "arbre", "sun": "soleil", "moon": "lune", "sea": "mer",
    "red": "rouge", "green": "vert", "friend": "ami", "day": "jour", "night": "nuit", "hand": "main",
    "cheese": "fromage", "milk": "lait", "horse": "cheval",
}  # fmt: skip
SPANISH = {
    "dog": "perro", "cat": "gato", "house": "casa", "water": "agua", "bread": "pan", "apple": "manzana",
    "car": "coche", "book": "libro", "tree": "árbol", "sun": "sol", "moon": "luna", "sea": "mar",
    "red": "rojo", "green": "verde", "friend": "amigo", "day": "día", "night": "noche", "hand": "mano",
    "cheese": "queso", "milk": "leche", "horse": "caballo",
}  # fmt: skip
GERMAN = {
    "dog": "Hund", "cat": "Katze", "house": "Haus", "water": "Wasser", "bread": "Brot", "apple": "Apfel",
    "car": "Auto", "book": "Buch", "tree": "Baum", "sun": "Sonne", "moon": "Mond", "sea": "Meer",
    "red": "rot", "green": "grün", "friend": "Freund", "day": "Tag", "night": "Nacht", "hand": "Hand",
    "cheese": "Käse", "milk": "Milch", "horse": "Pferd",
}  # fmt: skip
COLOUR = {
    "a banana": "yellow", "grass": "green", "the sky on a clear day": "blue", "snow": "white", "coal": "black",
    "a ripe tomato": "red", "an orange": "orange", "a lemon": "yellow", "a frog": "green", "milk": "white",
    "a crow": "black", "blood": "red", "a carrot": "orange", "an aubergine": "purple", "chocolate": "brown",
    "a lime": "green", "a polar bear": "white", "a strawberry": "red", "the sea": "blue", "a plum": "purple",
    "soil": "brown",
}  # fmt: skip
KIND = {
    "carrot": "vegetable", "potato": "vegetable", "onion": "vegetable", "cabbage": "vegetable",
    "spinach": "vegetable", "apple": "fruit", "banana": "fruit", "mango": "fruit", "cherry": "fruit",
    "peach": "fruit", "tiger": "animal", "rabbit": "animal", "whale": "animal", "camel": "animal",
    "otter": "animal", "hammer": "tool", "saw": "tool", "wrench": "tool", "chisel": "tool", "spanner": "tool",
    "pear": "fruit", "lettuce": "vegetable",
}  # fmt: skip
SIDES = {
    "triangle": "3", "square": "4", "rectangle": "4", "pentagon": "5", "hexagon": "6", "heptagon": "7",
    "octagon": "8", "nonagon": "9", "decagon": "10", "dodecagon": "12", "rhombus": "4", "trapezium": "4",
    "hendecagon": "11", "kite": "4",
}  # fmt: skip
AUTHOR = {
    "Hamlet": "Shakespeare", "Macbeth": "Shakespeare", "Emma": "Austen", "Persuasion": "Austen",
    "Oliver Twist": "Dickens", "Great Expectations": "Dickens", "War and Peace": "Tolstoy",
    "Anna Karenina": "Tolstoy", "1984": "Orwell", "Animal Farm": "Orwell", "The Odyssey": "Homer",
    "The Iliad": "Homer", "Dracula": "Stoker", "Ulysses": "Joyce", "Dubliners": "Joyce",
    "Frankenstein": "Shelley", "The Trial": "Kafka", "The Castle": "Kafka", "Moby-Dick": "Melville",
    "Les Misérables": "Hugo", "Notre-Dame de Paris": "Hugo",
}  # fmt: skip
NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
MONTHS = "January February March April May June July August September October November December".split()


def roman(n: int) -> str:
    out = ""
    for value, numeral in ((10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out, n = out + numeral, n - value
    return out


def cycle(name, question, names, step):
    def make(rng, count=ITEMS):
        keys = rng.sample(range(len(names)), min(count, len(names)))
        return [
            item(
                rng,
                question(names[k]),
                names[(k + step) % len(names)],
                rng.sample([n for n in names if n != names[(k + step) % len(names)]], 3),
            )
            for k in keys
        ]

    return name, make


def pairs(name, question, answer, low=1, high=99, options=None):
    """Items on two distinct numbers, no question twice; near-miss choices unless ``options``."""

    def make(rng, count=ITEMS):
        made = {}
        while len(made) < count:
            a, b = rng.sample(range(low, high + 1), 2)
            gold = answer(a, b)
            choices = numeric(rng, gold) if options is None else [str(o) for o in options(a, b)]
            made.setdefault(question(a, b), item(rng, question(a, b), str(gold), choices))
        return list(made.values())

    return name, make


TASKS = [
    *(arithmetic(f"add_{k}", lambda a, k=k: f"What is {a} plus {k}?", lambda a, k=k: a + k) for k in (3, 7, 11, 20, 50)),
    *(arithmetic(f"sub_{k}", lambda a, k=k: f"What is {a} minus {k}?", lambda a, k=k: a - k, low=k + 1) for k in (2, 5, 10, 25)),
    *(arithmetic(f"mul_{k}", lambda a, k=k: f"What is {a} times {k}?", lambda a, k=k: a * k, high=30, spread=(1, k, 10)) for k in (2, 3, 5, 10)),
    arithmetic("double", lambda a: f"What is double {a}?", lambda a: 2 * a),
    arithmetic("half", lambda a: f"What is half of {2 * a}?", lambda a: a),
    arithmetic("next", lambda a: f"Which number comes after {a}?", lambda a: a + 1),
    arithmetic("previous", lambda a: f"Which number comes before {a}?", lambda a: a - 1, low=2),
    arithmetic("square", lambda a: f"What is {a} squared?", lambda a: a * a, low=2, high=25, spread=(1, 2, 10, 20)),
    arithmetic("last_digit", lambda a: f"What is the last digit of {a}?", lambda a: a % 10, low=10, high=999, spread=(1, 2, 3)),
    arithmetic("first_digit", lambda a: f"What is the first digit of {a}?", lambda a: int(str(a)[0]), low=10, high=999, spread=(1, 2, 3)),
    arithmetic("tens", lambda a: f"How many tens are in {a}?", lambda a: a // 10, low=10, high=99, spread=(1, 2, 3)),
    arithmetic("minutes", lambda a: f"How many minutes are in {a} hours?", lambda a: 60 * a, high=24, spread=(1, 10, 60)),
    arithmetic("week_days", lambda a: f"How many days are in {a} weeks?", lambda a: 7 * a, high=30, spread=(1, 7)),
    arithmetic("digit_sum", lambda a: f"What is the sum of the digits of {a}?", lambda a: sum(map(int, str(a))), low=10, high=999, spread=(1, 2, 3)),
    pairs("add", lambda a, b: f"What is {a} plus {b}?", lambda a, b: a + b),
    pairs("times", lambda a, b: f"What is {a} times {b}?", lambda a, b: a * b, low=2, high=12),
    pairs("difference", lambda a, b: f"What is the difference between {a} and {b}?", lambda a, b: abs(a - b)),
    pairs("larger", lambda a, b: f"Which is larger, {a} or {b}?", max, options=lambda a, b: (a, b, a + b, max(a, b) + 1)),
    pairs("smaller", lambda a, b: f"Which is smaller, {a} or {b}?", min, options=lambda a, b: (a, b, a + b, max(a, b) + 1)),
    pairs("parity", lambda a, b: f"Is {a} even or odd?", lambda a, b: "even" if a % 2 == 0 else "odd", options=lambda a, b: ("even", "odd", "prime", "negative")),
    spelling("first_letter", lambda w: f"What is the first letter of the word '{w}'?", lambda w: w[0]),
    spelling("last_letter", lambda w: f"What is the last letter of the word '{w}'?", lambda w: w[-1]),
    spelling("second_letter", lambda w: f"What is the second letter of the word '{w}'?", lambda w: w[1]),
    spelling("length", lambda w: f"How many letters are in the word '{w}'?", lambda w: str(len(w)), lambda w: [str(n) for n in range(3, 11)]),
    spelling("backwards", lambda w: f"What is '{w}' spelled backwards?", lambda w: w[::-1]),
    spelling("capitals", lambda w: f"What is '{w}' in capital letters?", lambda w: w.upper()),
    spelling("vowels", lambda w: f"How many vowels are in the word '{w}'?", lambda w: str(sum(c in "aeiou" for c in w)), lambda w: [str(n) for n in range(0, 6)]),
    cycle("letter_after", lambda c: f"Which letter comes after {c} in the alphabet?", LETTERS, 1),
    cycle("letter_before", lambda c: f"Which letter comes before {c} in the alphabet?", LETTERS, -1),
    cycle("month_after", lambda m: f"Which month comes after {m}?", MONTHS, 1),
    cycle("month_before", lambda m: f"Which month comes before {m}?", MONTHS, -1),
    mapping("alphabet_position", lambda n: f"What is letter number {n} of the alphabet?", {str(i + 1): c for i, c in enumerate(LETTERS)}),
    mapping("number_word", lambda n: f"How is the number {n} written in words?", {str(i): w for i, w in enumerate(NUMBER_WORDS)}),
    mapping("word_number", lambda w: f"Which number is '{w}'?", {w: str(i) for i, w in enumerate(NUMBER_WORDS)}),
    mapping("roman", lambda n: f"What is {n} in Roman numerals?", {str(n): roman(n) for n in range(1, 30)}),
    mapping("from_roman", lambda r: f"Which number is the Roman numeral {r}?", {roman(n): str(n) for n in range(1, 30)}),
    mapping("continent", lambda c: f"On which continent is {c}?", CONTINENT),
    mapping("capital", lambda c: f"What is the capital of {c}?", CAPITAL),
    mapping("country_of_capital", lambda c: f"Which country has {c} as its capital?", {v: k for k, v in CAPITAL.items()}),
    mapping("language", lambda c: f"What is the main language of {c}?", LANGUAGE),
    mapping("currency", lambda c: f"What is the currency of {c}?", CURRENCY),
    mapping("symbol", lambda e: f"What is the chemical symbol for {e}?", SYMBOL),
    mapping("element", lambda s: f"Which element has the chemical symbol {s}?", {v: k for k, v in SYMBOL.items()}),
    mapping("sound", lambda a: f"What sound does a {a} make?", SOUND),
    mapping("young", lambda a: f"What is a young {a} called?", YOUNG),
    mapping("opposite", lambda w: f"What is the opposite of '{w}'?", OPPOSITE),
    mapping("plural", lambda w: f"What is the plural of '{w}'?", PLURAL),
    mapping("past", lambda w: f"What is the past tense of '{w}'?", PAST),
    mapping("french", lambda w: f"What is '{w}' in French?", FRENCH),
    mapping("spanish", lambda w: f"What is '{w}' in Spanish?", SPANISH),
    mapping("german", lambda w: f"What is '{w}' in German?", GERMAN),
    mapping("colour", lambda t: f"What colour is {t}?", COLOUR),
    mapping("kind", lambda t: f"Is a {t} a fruit, a vegetable, an animal or a tool?", KIND),
    mapping("sides", lambda s: f"How many sides does a {s} have?", SIDES),
    mapping("author", lambda b: f"Who wrote {b}?", AUTHOR),
]  # fmt: skip


# Tasks no family used before `tuning2` (research/pools/prereg/tuning2.txt), outside TASKS so that
# tasks.jsonl, seeded by each task's index there, stays as it was. Each gives at least 64 items.
MORE_TASKS = [
    *(arithmetic(f"add_{k}", lambda a, k=k: f"What is {a} plus {k}?", lambda a, k=k: a + k) for k in (9, 40, 100)),
    *(arithmetic(f"sub_{k}", lambda a, k=k: f"What is {a} minus {k}?", lambda a, k=k: a - k, low=k + 1) for k in (4, 15)),
    arithmetic("triple", lambda a: f"What is three times {a}?", lambda a: 3 * a, spread=(1, 3, 10)),
    arithmetic("double_plus_one", lambda a: f"What is double {a}, plus one?", lambda a: 2 * a + 1),
    arithmetic("from_hundred", lambda a: f"What is 100 minus {a}?", lambda a: 100 - a),
    arithmetic("mod_3", lambda a: f"What is the remainder when {a} is divided by 3?", lambda a: a % 3, low=10, high=999, spread=(1, 2, 3)),
    arithmetic("hundreds", lambda a: f"How many hundreds are in {a}?", lambda a: a // 100, low=100, high=999, spread=(1, 2, 3)),
]  # fmt: skip

# Tasks no family used before `tuning3` (research/pools/prereg/tuning3.txt), outside TASKS as MORE_TASKS is.
THIRD_TASKS = [
    *(arithmetic(f"add_{k}", lambda a, k=k: f"What is {a} plus {k}?", lambda a, k=k: a + k) for k in (6, 30, 75)),
    *(arithmetic(f"sub_{k}", lambda a, k=k: f"What is {a} minus {k}?", lambda a, k=k: a - k, low=k + 1) for k in (8, 30)),
    arithmetic("quadruple", lambda a: f"What is four times {a}?", lambda a: 4 * a, spread=(1, 4, 10)),
    arithmetic("double_minus_one", lambda a: f"What is double {a}, minus one?", lambda a: 2 * a - 1),
    arithmetic("from_150", lambda a: f"What is 150 minus {a}?", lambda a: 150 - a),
    arithmetic("mod_5", lambda a: f"What is the remainder when {a} is divided by 5?", lambda a: a % 5, low=10, high=999, spread=(1, 2, 3)),
    arithmetic("digits_reversed", lambda a: f"What is {a} with its two digits reversed?", lambda a: int(str(a)[::-1]), low=12, high=98, spread=(1, 9, 10)),
]  # fmt: skip

# Tasks no family or pool used before `plan54` (research/pools/prereg/plan_guard.txt).
FOURTH_TASKS = [
    *(arithmetic(f"add_{k}", lambda a, k=k: f"What is {a} plus {k}?", lambda a, k=k: a + k) for k in (5, 15, 60)),
    *(arithmetic(f"sub_{k}", lambda a, k=k: f"What is {a} minus {k}?", lambda a, k=k: a - k, low=k + 1) for k in (3, 12)),
    arithmetic("five_times", lambda a: f"What is five times {a}?", lambda a: 5 * a, spread=(1, 5, 10)),
    arithmetic("from_200", lambda a: f"What is 200 minus {a}?", lambda a: 200 - a),
    arithmetic("mod_4", lambda a: f"What is the remainder when {a} is divided by 4?", lambda a: a % 4, low=10, high=999, spread=(1, 2, 3)),
    arithmetic("double_plus_three", lambda a: f"What is double {a}, plus three?", lambda a: 2 * a + 3),
    arithmetic("half_plus_one", lambda a: f"What is half of {2 * a}, plus one?", lambda a: a + 1),
]  # fmt: skip


def main() -> None:
    rows = []
    for index, (name, make) in enumerate(TASKS):
        items = make(random.Random(index))
        assert len(items) >= 12 and all(len(i["choices"]) == 4 for i in items), name
        assert len({i["question"] for i in items}) == len(items), f"{name}: a question twice"
        rows.append({"id": f"task_{name}", "category": "task", "items": items, "train": round(0.6 * len(items))})
    out = Path(__file__).with_name("tasks.jsonl")
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{len(rows)} tasks, {sum(len(r['items']) for r in rows)} items -> {out}")


if __name__ == "__main__":
    main()
