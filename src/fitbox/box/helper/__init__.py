"""fitbox-helper: a model name that is not weights. A chat naming it is answered here with
guided menus over the box's state and settings (menu.py: the grammar; answers.py: the
reading menus and the config block's call site; helper.py: the reply; assist.py: a sentence
mapped by ``assist_model``). Only the name is here: the rest is imported from its module
(box/serving.py needs the name, and the menus need the box)."""

from __future__ import annotations

from .menu import HELPER as HELPER
