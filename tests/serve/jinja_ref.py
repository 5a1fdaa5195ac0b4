"""Reference renderings for tests/test_jinja.c: chat templates and template features
rendered by jinja2 itself, set up as transformers' apply_chat_template sets it up
(a sandboxed environment with trim_blocks, lstrip_blocks and loop controls; tojson,
raise_exception and strftime_now). Prints a JSON list of cases
{"name", "template", "vars", "want"} or {"name", "template", "vars", "error": true}
(jinja2 raised). Exit 77 when jinja2 is not installed."""
import json
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print("SKIP: jinja2 is not installed (%s)" % e, file=sys.stderr)
    sys.exit(77)


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: its body, rendered as it is."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

# Chat templates in the forms models ship (written here in those styles)
CHATML = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou answer briefly.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")
LLAMA3 = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{%- if system_message %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" + system_message + \"<|eot_id|>\" }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")
MISTRAL = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('turns must go user, assistant, user after an optional system turn') }}\n"
    "    {%- endif %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
    "        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- ' ' + message['content'] + eos_token}}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('this template takes user and assistant turns and one system turn first') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n")
ZEPHYR = (
    "{% for message in messages %}\n"
    "{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n"
    "{{ '<|assistant|>' }}\n"
    "{% endif %}\n"
    "{% endfor %}")
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('this template has no system turn') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('turns must alternate, starting with the user') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
NS_TEMPLATE = (
    "{%- set ns = namespace(found=false, n=0) -%}\n"
    "{%- for m in messages -%}\n"
    "  {%- if m.role == 'system' -%}{%- set ns.found = true -%}{%- endif -%}\n"
    "  {%- set ns.n = ns.n + 1 -%}\n"
    "{%- endfor -%}\n"
    "{{ ns.found }} {{ ns.n }}|{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.content|upper }} {% endfor %}")

SYS = {"role": "system", "content": "You are terse."}
U1 = {"role": "user", "content": "Hi there!"}
A1 = {"role": "assistant", "content": "Hello. How can I help?"}
U2 = {"role": "user", "content": "  Name a colour. \u00e9\u2603 "}
CONVS = {"u": [U1], "su": [SYS, U1], "suau": [SYS, U1, A1, U2], "uau": [U1, A1, U2], "uu": [U1, U2], "sa": [SYS, A1]}
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

# Features one at a time: (name, template, vars)
FEATURES = [
    ("text", "plain text\nover lines\n", {}),
    ("expr", "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 * 3.5 }} {{ 10 - 4 }}", {}),
    ("str()", "{{ none }} {{ true }} {{ false }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ [1, 'a', none] }} {{ {'k': 'v'} }} [{{ undefined_name }}]", {}),
    ("floats", "{{ 1e3 }} {{ 2.5E-3 }} {{ 1_000 + 1 }} {{ 1.5e2|int }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ -0.0 }} {{ 1e-5 }} {{ 123456.789 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' + 'y' }} {{ [1] + [2, 3] }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 'b' > 'a' }} {{ 2 == 2.0 }} {{ 'a' != 'a' }} {{ 3 >= 4 }} {{ 1 == true }}", {}),
    ("in", "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", {}),
    ("logic", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not [] }} {{ '' or none }} {{ 'a' if 0 else 'b' }} {{ 'c' if 1 }}", {}),
    ("tests", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ 2 is number }} "
              "{{ {} is mapping }} {{ [] is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ x is not none }} {{ true is boolean }}",
     {"x": 1}),
    ("filters", "{{ '  a b  '|trim }}|{{ 'Hi'|upper }}|{{ 'Hi'|lower }}|{{ [1, 2, 3]|length }}|{{ 'h\u00e9'|length }}|"
                "{{ [3, 4]|first }}|{{ [3, 4]|last }}|{{ ['a', 'b']|join(', ') }}|{{ missing|default('dflt') }}|"
                "{{ ''|default('e', true) }}|{{ 'aXbX'|replace('X', '-') }}|{{ 'word up'|capitalize }}|{{ 'word up'|title }}|"
                "{{ [1, 2]|reverse|list }}|{{ 5|string }}|{{ '12'|int + 1 }}", {}),
    ("tojson", "{{ {'a': [1, 2.5, 'x\"y'], 'b': none, 'c': true, 'd': '\u00e9'}|tojson }} {{ 'q'|tojson }} {{ {'z': 1}|tojson(indent=2) }}", {}),
    ("methods", "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ 'a,b,c'.split(',') }}|"
                "{{ ' a  b '.split() }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith('lo') }}|{{ 'AbC'.lower() }}|"
                "{{ 'abc'.upper() }}|{{ 'a-b'.replace('-', '+') }}|{{ '-'.join(['x', 'y']) }}|{{ d.get('k') }}|{{ d.get('z', 9) }}|"
                "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys()|list }}|{{ d.values()|list }}",
     {"d": {"k": 1, "m": "n"}}),
    ("subscripts", "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[1:3] }} {{ 'hello'[1:4] }} "
                   "{{ 'hello'[::-1] }} {{ d['k'] }} {{ d.k }} {{ xs[10] is defined }}", {"xs": [1, 2, 3, 4], "d": {"k": "v"}}),
    ("unicode strings", "{{ s[0] }}|{{ s[-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}|{% for c in s %}<{{ c }}>{% endfor %}|"
                        "{{ s[2] is defined }}|{{ s[9] is defined }}", {"s": "\u00e9t\u00e9\u2603"}),
    ("loop", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
             "{{ loop.last }}{{ loop.length }}:{{ x }} {% else %}empty{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
     {"xs": ["a", "b"]}),
    ("loop controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}"
                      "{% endfor %}|{% for i in range(1, 8, 3) %}{{ i }}{% endfor %}|{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}", {}),
    ("loop scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}", {}),
    ("nested loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("dict loop", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}", {}),
    ("namespace", NS_TEMPLATE, {"messages": [SYS, U1, A1]}),
    ("whitespace",
     "a\n  {% if true %}\n  b\n  {% endif %}\n  c {{- ' d' }}  {{ 'e' -}}  \n f\n{# comment #}\ng {#- c2 -#} h\n  {%+ if true %}i{% endif %}\n",
     {}),
    ("whitespace 2", "{% for x in xs %}\n    {{ x }}\n{% endfor %}\nend\n  {%- if 1 %} j\n{% endif %}", {"xs": [1, 2]}),
    ("escapes", "{{ 'tab\\tnew\\nquote\\'' }}|{{ \"dq\\\"\" }}|{{ 'a' 'b' }}", {}),
    ("set", "{% set a = [1, 2] %}{% set b = a + [3] %}{{ b }} {% set c = {'k': a} %}{{ c.k[1] }}", {}),
    ("generation", "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
     {"messages": [U1]}),
    ("select", "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}|"
               "{{ messages|rejectattr('role', 'equalto', 'user')|list|length }}|{{ messages|selectattr('tool_calls', 'undefined')|list|length }}|"
               "{{ messages|selectattr('name')|list|length }}|{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3]|reject('equalto', 2)|list }}|"
               "{{ ['a ', ' b']|map('trim')|join(',') }}|{{ messages|map(attribute='role')|join(' ') }}",
     {"messages": [SYS, U1, A1, dict(U2, name="n")]}),
    ("nested expr", "{{ ((((1 + 2) * 3) - 4) // 2) }} {{ -(-3) }} {{ not not 1 }} {{ -xs|length }}", {"xs": [1, 2]}),
    # things jinja2 refuses when run: fathom must refuse them too
    ("raise", "{{ raise_exception('no system role') }}", {}),
    ("undefined attribute", "{{ nothing.attr }}", {}),
    ("undefined arithmetic", "{{ nothing + 1 }}", {}),
    ("string plus number", "{{ 'a' + 1 }}", {}),
    ("division by zero", "{{ 1 // 0 }}", {}),
    ("unclosed tag", "{% if true %}x", {}),
    ("unknown end", "{% endfor %}", {}),
    ("bad syntax", "{{ 1 + }}", {}),
]


def render(t, v):
    try:
        return {"want": env.from_string(t).render(**v)}
    except Exception:
        return {"error": True}


cases = []
for name, t, v in FEATURES:
    cases.append(dict({"name": name, "template": t, "vars": v}, **render(t, v)))
for tname, t in (("chatml", CHATML), ("llama3", LLAMA3), ("mistral", MISTRAL), ("zephyr", ZEPHYR), ("gemma", GEMMA), ("phi3", PHI3)):
    for cname, msgs in CONVS.items():
        for gen in (True, False):
            v = dict(TOKENS, messages=msgs, add_generation_prompt=gen)
            cases.append(dict({"name": "%s/%s/%s" % (tname, cname, "gen" if gen else "nogen"), "template": t, "vars": v}, **render(t, v)))
print(json.dumps(cases, ensure_ascii=False))
