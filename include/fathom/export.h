/* fathom/export.h: FM_API marks each function of the public API.
 *
 * The library is compiled with -fvisibility=hidden, so only the declarations
 * marked FM_API are exported from libfathom.so; everything in src/ stays
 * internal (tests and the command reach it through the static library).
 * Static linking needs nothing special: the attribute only affects the
 * dynamic symbol table. A consumer may predefine FM_API to override it. */
#ifndef FATHOM_EXPORT_H
#define FATHOM_EXPORT_H

#ifndef FM_API
#if defined(__GNUC__) || defined(__clang__)
#define FM_API __attribute__((visibility("default")))
#else
#define FM_API
#endif
#endif

#endif
