"""The datasets known by name (`DATASETS`): each one's languages, splits and text files, and for each
file where it comes from (a plain or .gz file at a URL, an SGML member of a .tgz archive, a Hugging
Face dataset, or, licensed, a mirror alone), its name in a mirror and the sha256 of its text.
`transduce.data.datasets.fetch` gets them.

The full WMT14 training corpora come through Hugging Face `datasets` (or a mirror); the Penn
Treebank, LDC licensed, only ever from a mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import DataError


@dataclass(frozen=True)
class Source:
    """One text file of a dataset: its origin, its checksum and its name in a mirror."""

    mirror: str  # path under <data_dir>/<dataset>/
    url: str | None = None  # a .gz or plain text file, or a .tgz archive holding `member`
    sha256: str | None = None  # of the uncompressed text; None: cannot be verified
    member: str | None = None  # the SGML file to extract from the .tgz at `url`
    hf: tuple[str, str] | None = None  # (Hugging Face dataset, config) to load it from instead

    @property
    def cache_name(self) -> str:
        """Name in the cache: the mirror path, without .gz unless the download is gzip."""
        return self.mirror if self.url and self.url.endswith(".gz") else self.mirror.removesuffix(".gz")


@dataclass(frozen=True)
class DatasetInfo:
    """A named parallel dataset: its languages, splits and files."""

    name: str
    description: str
    langs: tuple[str, ...]
    train: str  # the split names `transduce prepare` uses by default
    valid: str
    tests: tuple[str, ...]  # tests[0] is the main test set
    files: dict[tuple[str, str, str], Source] = field(repr=False)  # (variant, split, lang) -> Source
    kind: str = "parallel"  # or "treebank": one file of trees per split (transduce.parsing)

    @property
    def variants(self) -> list[str]:
        return sorted({v for v, _, _ in self.files})

    @property
    def splits(self) -> list[str]:
        return sorted({s for _, s, _ in self.files})

    def source(self, split: str, lang: str, variant: str = "raw") -> Source:
        for what, value, known in (("variant", variant, self.variants), ("language", lang, self.langs)):
            if value not in known:
                raise DataError(f"{self.name} has no {what} {value!r} (choose from {', '.join(known)})")
        if (variant, split, lang) not in self.files:
            raise DataError(f"{self.name} has no split {split!r} (choose from {', '.join(self.splits)})")
        return self.files[variant, split, lang]


# --- Multi30k ------------------------------------------------------------------------------------

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/data/task1"

# sha256 of the uncompressed files (also in shared/data/multi30k/PROVENANCE.md)
MULTI30K_SHA256 = {
    ("raw", "train", "en"): "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    ("raw", "train", "de"): "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    ("raw", "train", "fr"): "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    ("raw", "val", "en"): "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    ("raw", "val", "de"): "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    ("raw", "val", "fr"): "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    ("raw", "test_2016_flickr", "en"): "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    ("raw", "test_2016_flickr", "de"): "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    ("raw", "test_2016_flickr", "fr"): "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    ("raw", "test_2017_flickr", "en"): "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98",
    ("raw", "test_2017_flickr", "de"): "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081",
    ("raw", "test_2017_flickr", "fr"): "6f3764e31dac41e9455e612958bcfd4e877c5e15cd66df2c2b2be6d9bd83e5b6",
    ("raw", "test_2017_mscoco", "en"): "43051fdfa86fd5395182e718a94ca67b1b227b9f7c79596ff0f6b813216981d2",
    ("raw", "test_2017_mscoco", "de"): "58277df3c75f92f7145a11b910b553d1cf82c439249d4dc237c899609eafac22",
    ("raw", "test_2017_mscoco", "fr"): "39cde3f43f32b0a6bf29ce4917a46329ff32e53070c2fac87506695a740ae0a0",
    ("tok", "train", "en"): "08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119",
    ("tok", "train", "de"): "cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505",
    ("tok", "train", "fr"): "8fa41bb718412bcb7c5dfa58603842810a01543eae86a51279f9886b901266e1",
    ("tok", "val", "en"): "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    ("tok", "val", "de"): "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    ("tok", "val", "fr"): "b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a",
    ("tok", "test_2016_flickr", "en"): "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    ("tok", "test_2016_flickr", "de"): "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    ("tok", "test_2016_flickr", "fr"): "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    ("tok", "test_2017_flickr", "en"): "c9d1dfd7a26add989382e534af235af9f0f658b2a30e7eb0efdaf142496ee54f",
    ("tok", "test_2017_flickr", "de"): "02067e4a9402786a4fcb8c1b6f4307e4a5073ced64800abead5273b54f5f31f6",
    ("tok", "test_2017_flickr", "fr"): "c0583117a47b31e8a6c6a97cfe8de153e462074668f4e994764fcc80b21d33b4",
    ("tok", "test_2017_mscoco", "en"): "fe69ae004d71c42ead0301e70c57de5b1b6b5fb7f52210d42b22801e98e656f3",
    ("tok", "test_2017_mscoco", "de"): "e2825990b8a4e5289d2cdba801d57c187810bab9b4f5d87a30c35800a0d871b6",
    ("tok", "test_2017_mscoco", "fr"): "0b6a4620f02b6b9acf7811fda23f90fed9c6baa0b96aa224db50a273078c84d1",
}


def _multi30k_source(variant: str, split: str, lang: str, sha256: str) -> Source:
    if variant == "raw":  # gzip upstream
        name = f"raw/{split}.{lang}.gz"
        return Source(mirror=name, url=f"{MULTI30K_URL}/{name}", sha256=sha256)
    name = f"tok/{split}.lc.norm.tok.{lang}"  # plain text upstream, gzip in the mirror
    return Source(mirror=name + ".gz", url=f"{MULTI30K_URL}/{name}", sha256=sha256)


MULTI30K = DatasetInfo(
    name="multi30k",
    description="Multi30k Task 1: Flickr30k image descriptions in en/de/fr (29k training pairs)",
    langs=("en", "de", "fr"),
    train="train",
    valid="val",
    tests=("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"),
    files={key: _multi30k_source(*key, sha256) for key, sha256 in MULTI30K_SHA256.items()},
)


# --- WMT 2014 -------------------------------------------------------------------------------------

WMT14_DEV = "http://www.statmt.org/wmt14/dev.tgz"
WMT14_TEST_FULL = "http://www.statmt.org/wmt14/test-full.tgz"
WMT14_TEST_FILTERED = "http://www.statmt.org/wmt14/test-filtered.tgz"
HF_WMT14 = "wmt/wmt14"  # the Hugging Face hub id of the former "wmt14" dataset
SEQ2SEQ_ATTN_URL = (
    "https://raw.githubusercontent.com/harvardnlp/seq2seq-attn/2d36b4348dad5a18571495feacddcf8c6620a678/data"
)

# sha256 of the plain text (shared/data/wmt14-en-*/PROVENANCE.md; Helsinki-NLP/OPUS-MT-testsets)
WMT14_SHA256 = {
    ("en-de", "newstest2012", "en"): "f9e51f85c4948033fc7d77ef427f4d88908a8dd3f778970f62d0baafac3ff97e",
    ("en-de", "newstest2012", "de"): "946b9587b79271b0f3ce9cc8c0e5b310e3021ef598e1ba5dc2a24fef8960de30",
    ("en-de", "newstest2013", "en"): "ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e",
    ("en-de", "newstest2013", "de"): "d7ea35ab91ff3709e03ad9cb6bf5b4f2cc775cd2d72efd5254c4aec5e69663ca",
    ("en-de", "newstest2014", "en"): "7294bccf2879a97b3706b95c9595f1459617a8ee7130d5d8581c910e69736971",
    ("en-de", "newstest2014", "de"): "ae5d110486bc33d7175e9e28c7d0051eb3e5fcd2166dd93371089852c091a20e",
    ("en-de", "newstest2014-filtered", "en"): "18db2323feae45b4b9e7d3b400d3ee3740f03a4da50046c07e3c255b9985a3f9",
    ("en-de", "newstest2014-filtered", "de"): "48fad9e043d7e8e89c06fa8203283501166e4f4a059f6cf08d9a4d6674a19fd8",
    ("en-de", "train-sample", "en"): "db668a7d798bddf21d1ab8fcb403efbc724ba01b70472ad30d1e2049fd46e12b",
    ("en-de", "train-sample", "de"): "fe1f824a189baa650eec46269e66eef07f7304ba7572598ebbe61c55eeff7d01",
    ("en-fr", "newstest2012", "en"): "f9e51f85c4948033fc7d77ef427f4d88908a8dd3f778970f62d0baafac3ff97e",
    ("en-fr", "newstest2012", "fr"): "29aa5aff172127f6adf5625cc2f8e44f579d524700e84f1ec0eb14f4f19719e4",
    ("en-fr", "newstest2013", "en"): "ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e",
    ("en-fr", "newstest2013", "fr"): "909b63be5df3eb8c13e1d5967bf3f0adfdb9f6ed5e638c5bffff563ee2ff7f41",
    ("en-fr", "newstest2014", "en"): "9a12cb6e8efb3509ebede627e4a9c83ee64935509d561ff70f4b7bd5f93f6096",
    ("en-fr", "newstest2014", "fr"): "2bd07dc204f965bf88e90adb6223a8cb850f9bf9840df6af1f4945195936656e",
}


def _wmt14_source(pair: str, split: str, lang: str) -> Source:
    """English is the "src" side of the SGML files, the other language the "ref" side."""
    other = pair.split("-")[1]
    role = "src" if lang == "en" else "ref"
    sha256 = WMT14_SHA256.get((pair, split, lang))
    archives = {
        "newstest2012": (WMT14_DEV, f"dev/{split}-{role}.{lang}.sgm"),
        "newstest2013": (WMT14_DEV, f"dev/{split}-{role}.{lang}.sgm"),
        "newstest2014": (WMT14_TEST_FULL, f"test-full/newstest2014-{other}en-{role}.{lang}.sgm"),
        "newstest2014-filtered": (WMT14_TEST_FILTERED, f"test/newstest2014-{other}en-{role}.{lang}.sgm"),
    }
    if split in archives:
        return Source(f"{split}.{lang}.gz", archives[split][0], sha256, archives[split][1])
    if split == "train-sample":
        name = "src-train.txt" if lang == "en" else "targ-train.txt"
        return Source(f"train.{lang}.gz", f"{SEQ2SEQ_ATTN_URL}/{name}", sha256)
    if split == "train":
        return Source(f"train-full.{lang}.gz", hf=(HF_WMT14, f"{other}-en"))
    raise ValueError(split)


def _wmt14(pair: str, description: str, splits: tuple[str, ...], tests: tuple[str, ...]) -> DatasetInfo:
    langs = tuple(pair.split("-"))
    files = {("raw", s, lang): _wmt14_source(pair, s, lang) for s in splits for lang in langs}
    return DatasetInfo(f"wmt14-{pair}", description, langs, "train", "newstest2013", tests, files)


# --- Penn Treebank WSJ (Section 6.3) ------------------------------------------------------------

# Mirror only (see its PROVENANCE.md): one tree per line, root TOP, traces and function tags removed;
# "22-auto-pos", "23-auto-pos" carry Stanford-tagger tags.
PTB_WSJ_FILES = {  # split -> (mirror file, sha256 of the uncompressed text)
    "02-21": ("train.trees.gz", "43179085595e2a70c60926674c3c9c3969ad6820c5aa71a39f0720a530f3b07e"),
    "22": ("dev.trees.gz", "b3cd4fe25519d131c2291c731939fbaab7baaf3f1657b1a228f554d555b87ff2"),
    "23": ("test.trees.gz", "9cfa902d91f48ee06c6a7ca8caf682c46e30a1c143e88a34f93a7a186d0e3873"),
    "22-auto-pos": ("dev.auto-pos.trees.gz", "920bbd9a8c2456c862eee65523af84903974b81993173e62fc87f739479c700b"),
    "23-auto-pos": ("test.auto-pos.trees.gz", "fa3259764017bed5be4afc68e226fff2f753a463d30c0eaffc6ebfda95456db2"),
}
PTB_WSJ = DatasetInfo(
    name="ptb-wsj",
    description="Penn Treebank WSJ constituency trees (LDC licensed; mirror only): 02-21 train, 22 dev, 23 test",
    langs=("trees",),
    train="02-21",
    valid="22",
    tests=("23",),
    files={("raw", split, "trees"): Source(mirror=m, sha256=h) for split, (m, h) in PTB_WSJ_FILES.items()},
    kind="treebank",
)


DATASETS: dict[str, DatasetInfo] = {
    "multi30k": MULTI30K,
    "wmt14-en-de": _wmt14(
        "en-de",
        "WMT 2014 English-German: newstest2012-2014; full training set through Hugging Face datasets",
        ("train", "train-sample", "newstest2012", "newstest2013", "newstest2014", "newstest2014-filtered"),
        ("newstest2014", "newstest2014-filtered"),
    ),
    "wmt14-en-fr": _wmt14(
        "en-fr",
        "WMT 2014 English-French: newstest2012-2014; full training set through Hugging Face datasets",
        ("train", "newstest2012", "newstest2013", "newstest2014"),
        ("newstest2014",),
    ),
    "ptb-wsj": PTB_WSJ,
}
