"""The port `fathom serve` listens on, read from its log (the shell tests start it with --port 0)."""
import time


def port_of(log, tries=300):
    text = ""
    for _ in range(tries):
        text = open(log).read()
        if "listening on http://127.0.0.1:" in text:
            break
        time.sleep(0.05)
    return int(text.split("listening on http://127.0.0.1:")[1].split()[0])
