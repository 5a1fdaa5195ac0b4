/* fathom/hf.h: models in Hugging Face layout.
 *
 * A directory holding config.json (with "model_type"), model.safetensors (or
 * sharded model-*.safetensors with model.safetensors.index.json) and tokenizer
 * files:
 *   gpt2   GPT2LMHeadModel: vocab.json + merges.txt (byte-level BPE)
 *   llama  LlamaForCausalLM: tokenizer.json (SentencePiece-style BPE with byte
 *          fallback, fm_tokenizer_load_hf_json), or vocab.json + merges.txt
 *   qwen2  Qwen2ForCausalLM: Llama's model with biases on q, k and v
 *          (fm_gpt_config.qkv_bias); its byte-level tokenizer.json
 *   bert   BertModel as sentence-transformers uses it (all-MiniLM-L6-v2): vocab.txt,
 *          tokenizer_config.json, sentence_bert_config.json, modules.json and the
 *          pooling folder's config.json
 * config.json keys are checked against what each model type reads: a missing
 * required key, a key fathom does not know, or a value it cannot express (an
 * activation other than the model's, attention biases in Llama, an unsupported
 * rope_type, Qwen2's sliding window shorter than the context) is refused, naming the file and the key. */
#ifndef FATHOM_HF_H
#define FATHOM_HF_H
#include "fathom/export.h"

#include "fathom/gpt.h"
#include "fathom/tensor.h"
#include "fathom/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether dir/config.json exists and names a "model_type" (a Hugging Face model
 * rather than one `fathom train` wrote). */
FM_API bool fm_hf_is_model_dir(const char *dir);

/* A GPT-2, Llama or Qwen2 config.json (from memory; name labels errors) as fathom's GPT
 * config. */
FM_API fm_status fm_hf_gpt_config_parse(const char *json, size_t len, const char *name, fm_gpt_config *out);

/* Loads a GPT-2, Llama or Qwen2 directory. tok (may be NULL) receives the tokenizer from
 * vocab.json + merges.txt when both exist, else from tokenizer.json; a tokenizer
 * with ids beyond the model's vocab_size is refused. Weights may be f32, f16 or bf16 (converted to f32). */
FM_API fm_gpt *fm_hf_gpt_load(const char *dir, fm_tokenizer **tok);

/* The tokenizer of a model or graph directory: fathom's tokenizer.txt (of exactly
 * model_vocab tokens), else vocab.json + merges.txt (byte-level BPE), else
 * tokenizer.json (of at most model_vocab tokens: Hugging Face vocabularies are often
 * padded). NULL with the reason when there is none or it does not fit. */
FM_API fm_tokenizer *fm_hf_tokenizer_load(const char *dir, int model_vocab);
/* The names of the files that fm_hf_tokenizer_load would read in dir (a static,
 * NULL-terminated list), or NULL when there are none. */
FM_API const char *const *fm_hf_tokenizer_files(const char *dir);

/* Writes m as a Hugging Face directory (config.json + model.safetensors) that
 * transformers' GPT2LMHeadModel / LlamaForCausalLM (Qwen2ForCausalLM for a Llama
 * with qkv_bias) load with the same logits. GPT-2 models without biases are written with zero biases (HF's GPT-2 has them). */
FM_API fm_status fm_hf_gpt_save(const fm_gpt *m, const char *dir);

/* ---- BERT sentence encoders (sentence-transformers layout) ---- */
typedef struct fm_hf_encoder fm_hf_encoder;
/* config.json (model_type bert), model.safetensors, vocab.txt; modules.json may
 * list Transformer, Pooling and Normalize (anything else is refused). */
FM_API fm_hf_encoder *fm_hf_encoder_load(const char *dir);
FM_API void fm_hf_encoder_free(fm_hf_encoder *e);
/* Dynamic int8 from here on: the weights of every encoder linear (attention
 * qkv and output, intermediate, output) quantized per output row, activations
 * per call (fm_qlinear_int8_packed on panels made by fm_pack_weight_int8;
 * docs/QUANTIZE.md's --int8 --dynamic). Embeddings,
 * LayerNorm, attention and pooling stay fp32. */
FM_API fm_status fm_hf_encoder_quantize_int8(fm_hf_encoder *e);
/* Embedding width: hidden size x the number of pooling modes on. */
FM_API int fm_hf_encoder_dim(const fm_hf_encoder *e);
/* Token ids of one text: [CLS] ... [SEP], cut at max_seq_length. *ids is malloc'd. */
FM_API fm_status fm_hf_encoder_tokenize(const fm_hf_encoder *e, const char *text, int32_t **ids, int64_t *n);
/* Embeddings of n texts: [n, dim] f32, pooled as the pooling config says (cls,
 * max, mean, mean_sqrt_len) and L2-normalized when modules.json has Normalize. */
FM_API fm_tensor *fm_hf_encoder_embed(fm_hf_encoder *e, const char *const *texts, int n);

#ifdef __cplusplus
}
#endif
#endif
