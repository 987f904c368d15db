"""ptm_app entry point: python main.py fit|validate|test|predict|data|export ... (see README)."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ptm_app.main import main

    sys.exit(main(sys.argv[1:]))
