/* Protobuf text format, the language of Triton's config.pbtxt, read into the JSON
 * form of the same message, so that one reader (model_config.c) checks a model's
 * configuration whichever file holds it.
 *
 * Written here rather than taken from a library: the ecosystem's text-format parser
 * is libprotobuf's C++ TextFormat, which needs C++ and Triton's generated
 * ModelConfig classes; protobuf-c (what the ONNX reader could have used) has no
 * text format at all. The grammar is small; tests/fuzz/fuzz_model_config.c fuzzes it.
 *
 * What it reads: `name: value` and `name { ... }` / `name: { ... }` / `name < ... >`
 * fields, `name: [v, ...]` lists, separators `,` and `;`, `#` comments, numbers
 * (decimal, hex, octal, floating point), strings in single or double quotes with C
 * escapes (adjacent strings join), enum names and true/false.
 *
 * How it maps to JSON, as protobuf's JSON form does: messages become objects; a
 * field that ModelConfig declares repeated becomes an array even when it appears
 * once; a map field (`parameters { key: "k" value { ... } }`) becomes an object
 * keyed by the entries' keys; enum names become strings. A field that is not
 * repeated may not appear twice when fathom reads it; one fathom ignores becomes an
 * array then (an unknown schema is not refused for what fathom does not read).
 * Extension and Any fields (`[type.googleapis.com/...]`) are refused. */
#ifndef FATHOM_SERVE_PBTXT_H
#define FATHOM_SERVE_PBTXT_H
#include <jansson.h>
#include <stddef.h>

/* The message in text[0..len) as a JSON object (new reference), or NULL with
 * FM_ERR_FORMAT set: "WHERE:LINE:COLUMN: what is wrong". */
json_t *fm_pbtxt_to_json(const char *text, size_t len, const char *where);
#endif
