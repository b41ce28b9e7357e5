from pathlib import Path

Path('gen.txt').write_text('generated 319\n')
