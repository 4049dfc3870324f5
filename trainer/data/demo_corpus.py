"""A synthetic English-like corpus for demos and tests, generated offline and prepared into shards.

The text comes from a small probabilistic grammar with the kind of structure a masked language model learns
from context. A document has a topic (its people, verbs with the objects they take, adjectives, places), a cast
of named people, a town, a year and a tense. Sentences have subject-verb and number agreement, "a"/"an",
possessives that agree with the subject, nouns with their usual adjectives, fixed phrases ("in order to",
"at the end of the", "not far from"), years that advance and counts that follow patterns. The function
words sit in fixed frames and are about as frequent as in English (the most frequent tokens, "." and "the",
are 5-7 % of the masked labels), so the "always predict the most frequent token" baseline is close to that of
real text.
Sentences of one document share topic, names and tense, so next-sentence prediction is learnable too.
Most documents are short and some are long, so sequence lengths vary as in real pretraining data: many
short and medium sequences, some at the maximum.

    python -m trainer.data.demo_corpus --out data/demo
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trainer.data.prepare import Log, PrepareOptions, check_options, check_out_dir, prepare_corpus
from trainer.errors import DataError

# Defaults of the demo data: small enough to generate in seconds and to train on a laptop CPU in minutes.
DEMO_OPTIONS = PrepareOptions(
    vocab_size=3000, max_seq_length=128, max_predictions=20, eval_fraction=0.04, samples_per_shard=16384
)
DEMO_DOCUMENTS = 24000  # about 37,000 train and 1,500 eval sequences
SHORT_DOCUMENT_FRACTION = 0.9  # documents of 1-3 sentences; the rest have 6-60 and give full-length sequences

# ------------------------------------------------------------------------------------------------ lexicon


def words(text: str) -> list[str]:
    """A word list written as one string, which reads better than a list literal for long lists."""
    return text.split()


# A topic: "people" (singular nouns), "verbs" (base form: the objects it takes), "adjectives" (for objects)
# and "places". Objects are singular count nouns; plurals are formed by `plural`.
# fmt: off
TOPICS: dict[str, dict] = {
    "farming": {
        "people": "farmer shepherd miller farmhand gardener beekeeper",
        "verbs": {"plant": "seed tree vine bean", "harvest": "apple pear grape bean", "feed": "cow sheep goat horse",
            "milk": "cow goat", "repair": "fence barn plough cart", "sell": "apple cheese egg sack",
            "water": "tree vine garden", "shear": "sheep goat"},
        "adjectives": "green ripe young old heavy brown", "places": "valley meadow orchard farm village",
    },
    "sailing": {
        "people": "sailor captain fisherman navigator pilot boatswain",
        "verbs": {"steer": "ship boat vessel", "load": "crate barrel sack", "mend": "sail net rope",
            "anchor": "ship boat", "catch": "fish crab eel", "chart": "course coast island",
            "hoist": "sail flag anchor", "unload": "crate barrel cargo"},
        "adjectives": "salty wooden wet tall swift broken", "places": "harbor coast island bay port",
    },
    "music": {
        "people": "singer drummer violinist composer conductor organist",
        "verbs": {"play": "violin drum piano organ flute", "compose": "song symphony anthem hymn",
            "tune": "violin piano guitar", "sing": "song hymn anthem ballad", "rehearse": "song symphony concert",
            "record": "album song concert", "conduct": "orchestra choir band"},
        "adjectives": "loud quiet famous beautiful slow cheerful", "places": "theater hall church studio academy",
    },
    "medicine": {
        "people": "doctor nurse surgeon pharmacist midwife patient",
        "verbs": {"treat": "fever wound infection injury", "examine": "patient wound lung heart",
            "prescribe": "medicine remedy tablet ointment", "bandage": "wound arm leg",
            "cure": "fever infection cough", "measure": "pulse temperature pressure",
            "clean": "wound instrument ward"},
        "adjectives": "sick healthy severe mild clean sterile", "places": "hospital clinic ward infirmary pharmacy",
    },
    "astronomy": {
        "people": "astronomer observer student professor mathematician engineer",
        "verbs": {"observe": "star planet comet moon eclipse", "measure": "orbit distance angle brightness",
            "photograph": "galaxy nebula comet moon", "calculate": "orbit distance position",
            "discover": "comet moon asteroid planet", "build": "telescope observatory instrument",
            "track": "satellite comet asteroid"},
        "adjectives": "bright distant faint red giant icy",
        "places": "observatory university laboratory mountain desert",
    },
    "cooking": {
        "people": "cook baker chef butcher waiter kitchen-maid",
        "verbs": {"bake": "bread cake pie loaf", "roast": "chicken lamb potato", "chop": "onion carrot herb",
            "boil": "egg potato soup", "serve": "dinner soup dessert meal", "season": "soup stew sauce",
            "stir": "soup sauce stew", "slice": "bread onion lemon"},
        "adjectives": "hot fresh sweet spicy golden delicious", "places": "kitchen bakery restaurant inn market",
    },
    "building": {
        "people": "builder mason carpenter architect plumber painter",
        "verbs": {"build": "wall house bridge tower", "paint": "wall door fence window", "lay": "brick stone tile",
            "design": "bridge house tower church", "fix": "roof pipe window door", "cut": "beam plank stone",
            "measure": "wall beam plank room", "raise": "roof tower beam"},
        "adjectives": "tall narrow solid wooden stone new", "places": "quarry workshop street square town",
    },
    "trade": {
        "people": "merchant banker trader clerk shopkeeper buyer",
        "verbs": {"buy": "silk spice horse carpet", "sell": "silk spice carpet wine", "count": "coin ledger crate",
            "ship": "cargo crate wine silk", "borrow": "loan coin sum", "sign": "contract letter ledger",
            "weigh": "spice coin grain", "price": "silk carpet wine"},
        "adjectives": "rich costly cheap rare foreign fine", "places": "market bank exchange warehouse city",
    },
    "forestry": {
        "people": "woodcutter ranger hunter trapper forester guide",
        "verbs": {"fell": "oak pine birch tree", "track": "deer wolf bear fox", "plant": "oak pine sapling",
            "guard": "forest trail camp", "trap": "rabbit fox beaver", "saw": "log plank branch",
            "follow": "trail river track", "hunt": "deer boar rabbit"},
        "adjectives": "dark ancient wild tall silent frozen", "places": "forest woodland lodge ridge clearing",
    },
    "school": {
        "people": "teacher pupil headmaster tutor librarian student",
        "verbs": {"read": "book poem letter chapter", "write": "essay letter poem report",
            "teach": "lesson class course", "grade": "essay exam report test",
            "study": "map lesson chapter language", "borrow": "book map atlas", "recite": "poem lesson verse",
            "copy": "letter map page"},
        "adjectives": "difficult easy long short clever careful", "places": "school library classroom college academy",
    },
}
# fmt: on

SYLLABLES_FIRST = words("al an ber cor dan el fen gar hal ing jor kel lor mar nor os per quin ros sel tor ul ver wen")
SYLLABLES_LAST = words("ton ford ley win son mer dale wick ham by ric den ly ward well mont")
GIVEN_NAMES = {
    "he": words("john thomas william james george henry robert edward arthur walter samuel peter"),
    "she": words("mary anne elizabeth sarah margaret alice emma clara ruth helen grace julia"),
}
TITLES = {"he": ("mr", "his"), "she": ("mrs", "her")}
NUMBER_WORDS = words("zero one two three four five six seven eight nine ten eleven twelve")
ORDINALS = words("first second third fourth fifth sixth seventh eighth ninth tenth")
MONTHS = words("january february march april may june july august september october november december")
# fmt: off
IRREGULAR_PAST = {
    "sell": "sold", "catch": "caught", "sing": "sang", "build": "built", "lay": "laid", "cut": "cut", "buy": "bought",
    "read": "read", "write": "wrote", "teach": "taught", "feed": "fed", "saw": "sawed", "ship": "shipped",
    "stir": "stirred", "chop": "chopped", "trap": "trapped",
}
IRREGULAR_PLURAL = {
    "sheep": "sheep", "fish": "fish", "deer": "deer", "loaf": "loaves", "wolf": "wolves", "midwife": "midwives",
    "fisherman": "fishermen", "cargo": "cargoes", "potato": "potatoes", "nebula": "nebulae",
}
# fmt: on


def plural(noun: str) -> str:
    if noun in IRREGULAR_PLURAL:
        return IRREGULAR_PLURAL[noun]
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def past(verb: str) -> str:
    if verb in IRREGULAR_PAST:
        return IRREGULAR_PAST[verb]
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def number_word(n: int) -> str:
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)


# ---------------------------------------------------------------------------------------------- documents


@dataclass
class Person:
    given: str
    surname: str
    pronoun: str  # "he" or "she"
    role: str  # a noun of the topic's people

    @property
    def formal(self) -> str:
        return f"{TITLES[self.pronoun][0]} {self.surname}"

    @property
    def possessive(self) -> str:
        return TITLES[self.pronoun][1]


@dataclass
class DocumentState:
    """What a document is about. Sentences draw from it, so the sentences of one document hang together."""

    rng: random.Random
    topic: dict
    cast: list[Person]
    verbs: dict[str, list[str]]  # the few verbs this document uses, each with its objects
    places: list[str]
    town: str
    year: int
    tense: str  # "past" or "present"
    counter: int = 0  # position in the "first ... second ... third" sequence

    def choice(self, items):
        return self.rng.choice(items)


def make_name(rng: random.Random) -> str:
    return rng.choice(SYLLABLES_FIRST) + rng.choice(SYLLABLES_LAST)


def new_document_state(rng: random.Random) -> DocumentState:
    topic = TOPICS[rng.choice(sorted(TOPICS))]
    people = topic["people"].split()
    cast = []
    for _ in range(rng.choice((1, 2, 2, 3))):
        pronoun = rng.choice(("he", "she"))
        cast.append(Person(rng.choice(GIVEN_NAMES[pronoun]), make_name(rng), pronoun, rng.choice(people)))
    verbs = {verb: topic["verbs"][verb].split() for verb in rng.sample(sorted(topic["verbs"]), 3)}
    places = rng.sample(topic["places"].split(), 2)
    tense = "past" if rng.random() < 0.7 else "present"
    return DocumentState(rng, topic, cast, verbs, places, make_name(rng), rng.randrange(1700, 1950), tense)


def adjectives_of(noun: str, topic: dict) -> list[str]:
    """The two adjectives a noun usually takes: the same pair everywhere in the corpus, a collocation."""
    return random.Random(noun).sample(topic["adjectives"].split(), 2)


# ---------------------------------------------------------------------------------------------- phrases
# The function words follow fixed frames (a determiner decided by what follows it, agreement, fixed
# prepositional phrases), as in English; their regularity is what a small model picks up first.


def verb_form(doc: DocumentState, verb: str, plural_subject: bool) -> str:
    if doc.tense == "past":
        return past(verb)
    return verb if plural_subject else third_person(verb)


def be_form(doc: DocumentState, plural_subject: bool) -> str:
    if doc.tense == "past":
        return "were" if plural_subject else "was"
    return "are" if plural_subject else "is"


def subject(doc: DocumentState) -> tuple[str, bool, str]:
    """A subject noun phrase, whether it is plural, and its possessive pronoun."""
    person = doc.choice(doc.cast)
    r = doc.rng.random()
    if r < 0.35:
        return person.formal, False, person.possessive
    if r < 0.5:
        return f"{person.given} {person.surname}", False, person.possessive
    if r < 0.7:
        return person.pronoun, False, person.possessive
    role = doc.choice(doc.topic["people"].split())
    if r < 0.8:
        return plural(role), True, "their"
    if r < 0.9:
        return f"{doc.choice(('many', 'two', 'three'))} {plural(role)}", True, "their"
    return f"the {role} from {doc.town}", False, doc.choice(("his", "her"))


def object_phrase(doc: DocumentState, noun: str, possessive: str) -> str:
    """The object noun with a determiner that agrees with it: "the" and numbers take one of the noun's two
    usual adjectives, "a"/"an", possessives and demonstratives mostly take the bare noun."""
    adjective = doc.choice(adjectives_of(noun, doc.topic))
    r = doc.rng.random()
    if r < 0.1:
        return f"the {adjective} {noun}"
    if r < 0.4:
        return f"{article(noun)} {noun}"
    if r < 0.6:
        return f"{possessive} {noun}"
    if r < 0.75:
        return f"{number_word(doc.rng.randrange(2, 13))} {adjective} {plural(noun)}"
    if r < 0.85:
        return f"{adjective} {plural(noun)}"
    if r < 0.93:
        return f"{doc.choice(('this', 'that'))} {noun}"
    return f"{doc.choice(('these', 'those'))} {adjective} {plural(noun)}"


def pick_verb(doc: DocumentState) -> tuple[str, str]:
    """One of the document's verbs and one of its objects."""
    verb = doc.choice(sorted(doc.verbs))
    return verb, doc.choice(doc.verbs[verb])


def verb_phrase(doc: DocumentState, plural_subject: bool, possessive: str) -> str:
    verb, noun = pick_verb(doc)
    r = doc.rng.random()
    if r < 0.12:
        did = "did not" if doc.tense == "past" else ("do not" if plural_subject else "does not")
        verb_words = f"{did} {verb}"
    elif r < 0.24:
        verb_words = f"wanted to {verb}" if doc.tense == "past" else f"will {verb}"
    else:
        verb_words = verb_form(doc, verb, plural_subject)
    words = f"{verb_words} {object_phrase(doc, noun, possessive)}"
    if doc.rng.random() < 0.4:
        words += " " + doc.choice(("carefully", "quickly", "slowly", "again", "together", "alone"))
    return words


def place_phrase(doc: DocumentState) -> str:
    place, r = doc.choice(doc.places), doc.rng.random()
    if r < 0.2:
        return f"in the {place} of {doc.town}"
    if r < 0.35:
        return f"near the {place}"
    if r < 0.45:
        return f"at the end of the {place}"
    return f"in {doc.town}" if r < 0.75 else f"not far from {doc.town}"


def time_phrase(doc: DocumentState) -> str:
    r = doc.rng.random()
    if r < 0.4:
        return f"in {doc.choice(MONTHS)} {doc.year}"
    if r < 0.7:
        return f"every {doc.choice(('morning', 'evening', 'week'))}"
    return "for many years" if r < 0.85 else f"last {doc.choice(('spring', 'summer', 'autumn', 'winter'))}"


def company_phrase(doc: DocumentState) -> str:
    return doc.choice(("with a few friends", "with great care", "without any help", "with some neighbors"))


def clause(doc: DocumentState) -> list[str]:
    subj, is_plural, possessive = subject(doc)
    words = [subj, verb_phrase(doc, is_plural, possessive)]
    if doc.rng.random() < 0.5:
        words.append(place_phrase(doc))
    return words


# ---------------------------------------------------------------------------------------------- sentences


def simple_sentence(doc: DocumentState) -> list[str]:
    words = clause(doc)
    if len(words) == 2 and doc.rng.random() < 0.6:
        words.append(place_phrase(doc))
    if doc.rng.random() < 0.5:
        words.append(time_phrase(doc))
    if doc.rng.random() < 0.4:
        words.append(company_phrase(doc))
    return words


def linked_sentence(doc: DocumentState) -> list[str]:
    link = doc.choice(("because", "and then", "while"))
    return [*clause(doc), link, *clause(doc)]


def purpose_sentence(doc: DocumentState) -> list[str]:
    verb, noun = pick_verb(doc)
    return ["in order to", verb, f"the {noun} ,", *clause(doc)]


def counting_sentence(doc: DocumentState) -> list[str]:
    _, noun = pick_verb(doc)
    n = doc.rng.randrange(1, 13)
    adjective = doc.choice(adjectives_of(noun, doc.topic))
    thing = f"one {adjective} {noun}" if n == 1 else f"{number_word(n)} {adjective} {plural(noun)}"
    return [f"there {be_form(doc, n != 1)} {thing}", place_phrase(doc)]


def year_sentence(doc: DocumentState) -> list[str]:
    doc.year += doc.rng.choice((1, 1, 2, 5, 10))
    when = doc.choice((f"in {doc.year} ,", f"in {doc.choice(MONTHS)} {doc.year} ,", f"by the year {doc.year} ,"))
    return [when, *clause(doc)]


def growth_sentence(doc: DocumentState) -> list[str]:
    _, noun = pick_verb(doc)
    start = doc.rng.randrange(1, 10) * 10
    grew = "grew" if doc.tense == "past" else "grows"
    return [f"the number of {plural(noun)} {grew} from {start} to {start + doc.choice((10, 20, 50))} in {doc.year}"]


def sequence_sentence(doc: DocumentState) -> list[str]:
    doc.counter = min(doc.counter + 1, len(ORDINALS))
    opener = "first ," if doc.counter == 1 else f"for the {ORDINALS[doc.counter - 1]} time ,"
    return [opener, *clause(doc)]


def description_sentence(doc: DocumentState) -> list[str]:
    person = doc.choice(doc.cast)
    adjective = doc.choice(("good", "old", "young", "careful", "famous", "honest", "busy", "quiet"))
    verb, noun = pick_verb(doc)
    return [f"{person.given} {person.surname} {be_form(doc, False)} {article(adjective)} {adjective} {person.role} who",
            verb_form(doc, verb, False), f"{person.possessive} own {plural(noun)}"]  # fmt: skip


def list_sentence(doc: DocumentState) -> list[str]:
    subj, is_plural, possessive = subject(doc)
    verb = doc.choice(sorted(doc.verbs))
    nouns = doc.rng.sample(doc.verbs[verb], min(3, len(doc.verbs[verb])))  # every verb takes two or more objects
    objects = [object_phrase(doc, noun, possessive) for noun in nouns]
    return [subj, verb_form(doc, verb, is_plural), " , ".join(objects[:-1]), "and", objects[-1]]


def said_sentence(doc: DocumentState) -> list[str]:
    person = doc.choice(doc.cast)
    said = "said" if doc.tense == "past" else "says"
    return [person.formal, said, "that", *clause(doc)]


def short_sentence(doc: DocumentState) -> list[str]:
    person = doc.choice(doc.cast)
    options = (f"{person.pronoun} agreed", f"{person.formal} smiled", f"{person.pronoun} returned to {doc.town}",
               "it rained all day", f"the {doc.choice(doc.places)} was quiet", "nobody came")  # fmt: skip
    return [doc.choice(options)]


SENTENCE_KINDS = (
    (simple_sentence, 6), (linked_sentence, 14), (purpose_sentence, 1), (counting_sentence, 2), (year_sentence, 2),
    (growth_sentence, 1), (sequence_sentence, 1), (description_sentence, 1), (list_sentence, 3), (said_sentence, 1),
    (short_sentence, 1),
)  # fmt: skip


def sentence(doc: DocumentState) -> str:
    kinds, weights = zip(*SENTENCE_KINDS, strict=True)
    words = doc.rng.choices(kinds, weights)[0](doc)
    if doc.rng.random() < 0.12:
        words.insert(0, doc.choice(("as a result ,", "at the same time ,")))
    text = " ".join(words) + " ."
    return text[0].upper() + text[1:]


def document_length(rng: random.Random) -> int:
    """Sentences per document: many short documents and some long ones (as articles in Wikipedia)."""
    if rng.random() < SHORT_DOCUMENT_FRACTION:
        return rng.randint(1, 3)
    return max(6, min(60, int(rng.lognormvariate(2.8, 0.5))))


def generate_documents(num_documents: int, seed: int) -> list[list[str]]:
    """`num_documents` documents as lists of sentences."""
    rng = random.Random(seed)
    documents = []
    for _ in range(num_documents):
        doc = new_document_state(rng)
        documents.append([sentence(doc) for _ in range(document_length(rng))])
    return documents


def write_text(documents: list[list[str]], path: Path) -> None:
    """One sentence per line, a blank line between documents (the input format of trainer.data.prepare)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")


def make_demo_data(
    out_dir: str | Path,
    documents: int = DEMO_DOCUMENTS,
    seed: int = 0,
    options: PrepareOptions = DEMO_OPTIONS,
    log: Log = print,
) -> dict:
    """Generate the corpus into `out_dir/corpus.txt` and prepare it into shards there; returns meta.json's content."""
    out_dir, start = Path(out_dir), time.perf_counter()
    if documents < 2:  # checked before the corpus file is written over
        raise DataError(f"--documents {documents}: must be at least 2 (one goes to the eval set)")
    check_options(replace(options, seed=seed))
    check_out_dir(out_dir)
    text_path = out_dir / "corpus.txt"
    write_text(generate_documents(documents, seed), text_path)
    log(f"generated {documents} documents into {text_path} [{time.perf_counter() - start:.1f} s]")
    return prepare_corpus([text_path], out_dir, replace(options, seed=seed), log=log)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.data.demo_corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", required=True, help="output directory (corpus.txt, vocab.txt, train/, eval/, meta.json)"
    )
    parser.add_argument("--documents", type=int, default=DEMO_DOCUMENTS, help="number of generated documents")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        make_demo_data(args.out, args.documents, args.seed)
    except DataError as e:  # bad options: said without a traceback, exit code 2 (as argparse's errors)
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
