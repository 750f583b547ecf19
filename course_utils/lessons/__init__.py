"""The solved exercise notebooks, as importable modules: `from course_utils.lessons.l02_first_kernels import add`.

Each module is the one source of solutions/NN_name.ipynb and exercises/NN_name.ipynb (see course_utils.build).
"""
