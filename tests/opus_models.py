"""Tiny MarianMT directories shaped as OPUS-MT publishes them (Helsinki-NLP/opus-mt-en-de's
configuration at a tiny size, random weights): two sentencepiece unigram models (source.spm,
target.spm) with sentencepiece's own ids, a vocab.json numbering their pieces as OPUS-MT does
(`</s>` 0, `<unk>` 1, the pieces, `<pad>` last; with `languages`, `>>xx<<` target-language tokens
after the two), swish, attention biases, a final logits bias, PAD as the decoder's start token.
`layout="tc-big"`: the pieces numbered as the tc-big models number them, EOS far from 0 (43311 of
57059 there); `separate`: a target_vocab.json of the target's pieces beside the source's vocab.json."""

import json
import random
from pathlib import Path

import sentencepiece as spm
import torch

from tiny_models import SRC_WORDS, TGT_WORDS, sentences

FR_WORDS = ["un", "homme", "femme", "chien", "court", "sur", "le", "gazon", "rouge", "bleu", "avec", "deux"]


def train_spm(prefix: Path, lines: list[str], size: int) -> Path:
    """A sentencepiece unigram model with its default special ids (<unk> 0, <s> 1, </s> 2), as OPUS-MT's."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_name(prefix.name + ".model")


def opus_vocab(*models: Path, languages: tuple[str, ...] = (), layout: str = "opus") -> dict[str, int]:
    """vocab.json as OPUS-MT writes it: </s> 0, <unk> 1, the language tokens, the pieces of the
    sentencepiece `models` (each once), <pad> last; `layout="tc-big"`: <unk> 1, </s> three quarters
    of the way through the pieces, <pad> last."""
    pieces = [f">>{lang}<<" for lang in languages]
    for path in models:
        sp = spm.SentencePieceProcessor(model_file=str(path))
        pieces += [
            sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)
        ]
    pieces = list(dict.fromkeys(pieces))
    if layout == "tc-big":
        pieces = pieces[:1] + ["<unk>"] + pieces[1:]
        pieces.insert(3 * len(pieces) // 4, "</s>")
    else:
        pieces = ["</s>", "<unk>"] + pieces
    return {p: i for i, p in enumerate(pieces + ["<pad>"])}


def make_opus_dir(
    root: Path,
    *,
    languages: tuple[str, ...] = (),
    d_model: int = 32,
    layers: int = 2,
    seed: int = 0,
    eos_bias: float = 3.0,
    weights: str = "safetensors",
    layout: str = "opus",
    separate: bool = False,
    generation: dict | None = None,
) -> Path:
    """A MarianMT directory under `root` as OPUS-MT publishes them, at a tiny size with random
    weights (every parameter, bias and LayerNorm drawn, the final logits bias too, EOS raised by
    `eos_bias` so that outputs end before the length limit). `weights`: "safetensors" or "bin";
    `layout`, `separate`: see the module's doc (separate vocabularies of different sizes, <pad> at
    one id in both, as transduce needs); `generation`: a generation_config.json's settings (the hub's
    OPUS-MT models: num_beams, max_length, bad_words_ids) beside the model's own."""
    from transformers import MarianConfig, MarianMTModel

    root.mkdir(parents=True, exist_ok=True)
    tgt_words = TGT_WORDS + (FR_WORDS if "fr" in languages else [])
    src_spm = train_spm(root / "src", sentences(SRC_WORDS, 300, seed), 60)
    tgt_spm = train_spm(root / "tgt", sentences(tgt_words, 300, seed + 1), 70)
    if separate:  # each side its own pieces (the target more), <pad> at one id in both, as transduce needs
        vocab = opus_vocab(src_spm, languages=languages, layout=layout)
        pad = vocab["<pad>"]
        pieces = list(opus_vocab(tgt_spm, layout=layout))  # in id order
        pieces.remove("<pad>")
        pieces.insert(pad, "<pad>")
        assert len(pieces) > len(vocab)
        tgt_vocab = {p: i for i, p in enumerate(pieces)}
    else:
        vocab = tgt_vocab = opus_vocab(src_spm, tgt_spm, languages=languages, layout=layout)
    V, V_tgt = len(vocab), len(tgt_vocab)
    pad, eos = vocab["<pad>"], vocab["</s>"]
    config = MarianConfig(  # Helsinki-NLP/opus-mt-en-de's config.json, smaller
        vocab_size=V,
        decoder_vocab_size=V_tgt,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        activation_function="swish",
        scale_embedding=True,
        static_position_embeddings=True,
        share_encoder_decoder_embeddings=not separate,
        tie_word_embeddings=True,
        normalize_before=False,
        normalize_embedding=False,
        add_bias_logits=False,
        max_position_embeddings=512,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=eos,
        decoder_start_token_id=pad,
        forced_eos_token_id=eos,
        architectures=["MarianMTModel"],
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias") or "norm" in name:
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_positions" not in name:  # sub-layers writing to the residual stream louder than the
                loud = 3.0 if "fc2" in name or "out_proj" in name else 1.0  # embedding: outputs not one token repeated
                p.copy_(torch.randn_like(p) * loud * p.size(-1) ** -0.5)
        model.final_logits_bias.copy_(0.5 * torch.randn_like(model.final_logits_bias))
        model.final_logits_bias[0, eos] += eos_bias
    out = root / "marian"
    model.save_pretrained(str(out))
    if weights == "bin":
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        (out / "model.safetensors").unlink()
        torch.save(state, out / "pytorch_model.bin")
    (out / "source.spm").write_bytes(src_spm.read_bytes())
    (out / "target.spm").write_bytes(tgt_spm.read_bytes())
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2), encoding="utf-8")
    if separate:
        (out / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False, indent=2), encoding="utf-8")
    tokenizer = {"source_lang": "en", "target_lang": "de", **({"separate_vocabs": True} if separate else {})}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    if generation is not None:  # as the hub's generation_config.json of an OPUS-MT model
        settings = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
        settings.update(generation)
        (out / "generation_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    return out


def opus_sentences(n: int, seed: int = 5, languages: tuple[str, ...] = ()) -> list[str]:
    """Source sentences; with `languages`, each starting with one of their `>>xx<<` tokens."""
    rng = random.Random(seed)
    lines = sentences(SRC_WORDS, n, seed, lo=1, hi=8)
    return [f">>{rng.choice(languages)}<< {line}" for line in lines] if languages else lines
