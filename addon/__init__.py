"""The capture proxy: a mitmproxy addon (capture.py) and the pieces it runs on."""
