"""The documented recipes that read only the prepared jobs, each on its own, run as written on the tiny model
(``docs_recipes.py``)."""

from __future__ import annotations

import pytest
from docs_recipes import prepare_folder, recipe_part, run_recipe

pytestmark = pytest.mark.slow
RECIPES = recipe_part(chained=False)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipes")
    return folder, prepare_folder(folder)


def test_the_part_holds_its_recipes():
    assert len(RECIPES) >= 15, RECIPES


@pytest.mark.parametrize("recipe", RECIPES, ids=[where for where, _ in RECIPES])
def test_recipe_runs_as_written(prepared, recipe):
    run_recipe(*prepared, *recipe)
