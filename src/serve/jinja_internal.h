/* The parsed form of a chat template (jinja.h), shared by jinja_parse.c and jinja_eval.c. */
#ifndef FATHOM_SERVE_JINJA_INTERNAL_H
#define FATHOM_SERVE_JINJA_INTERNAL_H
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "serve/jinja.h"

typedef enum {
    JE_LIT,    /* lit */
    JE_VAR,    /* name */
    JE_ATTR,   /* a.name */
    JE_ITEM,   /* a[b] */
    JE_SLICE,  /* a[b:c:d] (b, c, d may be NULL) */
    JE_CALL,   /* a(args) */
    JE_FILTER, /* a | name(args) */
    JE_TEST,   /* a is [not] name(args) */
    JE_BIN,    /* a op b */
    JE_NOT,    /* not a */
    JE_NEG,    /* -a */
    JE_COND,   /* a if b else c (c may be NULL: undefined) */
    JE_LIST,   /* [args] */
    JE_DICT,   /* {args[i]: vals[i]} */
} jexpr_kind;

/* Binary operators. */
enum { JOP_OR = 1, JOP_AND, JOP_EQ, JOP_NE, JOP_LT, JOP_GT, JOP_LE, JOP_GE, JOP_IN, JOP_NOTIN, JOP_ADD, JOP_SUB,
       JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_CONCAT };

typedef struct jexpr jexpr;
struct jexpr {
    jexpr_kind k;
    int line, op;
    bool neg;      /* JE_TEST: is not */
    char *name;    /* JE_VAR, JE_ATTR, JE_FILTER, JE_TEST */
    json_t *lit;   /* JE_LIT (owned) */
    jexpr *a, *b, *c, *d;
    int n;         /* arguments, list items, dict entries */
    jexpr **args;  /* [n] */
    char **kw;     /* [n]: a keyword argument's name, or NULL */
    jexpr **vals;  /* JE_DICT: [n] values */
};

typedef enum { JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_BREAK, JN_CONTINUE, JN_BLOCK } jnode_kind;

typedef struct jnode jnode;
typedef struct jbody {
    jnode **v;
    int n, cap;
} jbody;

struct jnode {
    jnode_kind k;
    int line;
    char *text; /* JN_TEXT */
    size_t len;
    jexpr *e;   /* JN_OUT, JN_SET's value, JN_FOR's iterable */
    /* JN_IF: conds[i] with bodies[i], then els; JN_FOR: body, els and filter */
    int n;
    jexpr **conds;
    jbody *bodies;
    jbody body, els;
    jexpr *filter;
    char *vars[2]; /* JN_FOR: the loop's names (vars[1] NULL for one); JN_SET: name, attribute (or NULL) */
};

struct fm_jinja {
    jbody root;
};

void fm_jinja_free_body(jbody *b);
/* "line L: " and the message into err[errn] (the parser's and the evaluator's errors). */
void fm_jinja_verror(char *err, size_t errn, int line, const char *fmt, va_list ap);
#endif
