"""Seconds the longest tests take on CI's 2 cores under ``pytest -n 2`` (their wall time in
``pytest --durations``), for :func:`conftest.pytest_collection_modifyitems`, which starts them
first: pytest-xdist hands tests out in collection order, so a long build collected late ran
alone at the end while the other worker sat idle. A key is a test's node id, or its node id
without the parameters (then every parametrization costs that). A test not listed keeps its
place after these; a stale number changes only the order, never what runs."""

SECONDS = {
    # -m slow: the nvcc builds (pytest --durations of a clean clone's -m slow run, 2 cores)
    "tests/test_epilogue_ring_cpu.py::test_every_accumulator_is_staged_where_tma_reads_its_coordinate": 220,
    "tests/test_gemm_clusters_cpu.py::test_the_cluster_mainloops_compile_for_sm90a_in_both_build_paths[separate]": 175,
    "tests/test_gemm_wave_tiles_cpu.py::test_the_wave_tiles_compile_for_sm90a_in_both_build_paths[separate]": 165,
    "tests/test_gemm_mainloop_cpu.py::test_the_new_values_compile_for_sm90a": 50,
    "tests/test_gemm_mainloop_cpu.py::test_the_new_values_compile_for_sm90a[32-deep k-tiles, swapped 144x128, "
    "eleven stages-problem5-d5-True]": 90,
    "tests/test_kernels.py::test_every_template_block_is_a_scope_naming_only_constant_macros": 65,
    "tests/test_light_headers.py::test_every_cutlass_kernel_with_a_light_header_builds_the_same_sass": 65,
    "tests/test_compile_speed.py::test_the_split_build_makes_the_same_kernel_as_a_whole_build": 60,
    # (listed lower than their measure: after the separate builds, whose host parts they reuse)
    "tests/test_gemm_clusters_cpu.py::test_the_cluster_mainloops_compile_for_sm90a_in_both_build_paths[whole]": 45,
    "tests/test_gemm_wave_tiles_cpu.py::test_the_wave_tiles_compile_for_sm90a_in_both_build_paths[whole]": 45,
    # (after the light-header and catalog builds of the representative CUTLASS kernel, whose
    # split build, host part, layout and frozen unit they reuse)
    "tests/test_separate_compilation.py::test_the_split_costs_nothing_beyond_the_link": 30,
    "tests/test_separate_compilation.py::test_a_body_that_only_the_whole_build_compiles_falls_back_to_it": 30,
    "tests/test_examples.py::test_example_runs[search_report_export.py]": 40,
    "tests/test_adversary_cpu.py::test_in_kernel_attack_is_buildable": 38,
    "tests/test_separate_compilation.py::test_concurrent_builders_in_two_processes_share_one_frozen_unit": 35,
    "tests/test_separate_compilation.py::test_a_second_candidate_compiles_only_its_own_unit_and_loads_as_the_launcher_expects": 32,
    "tests/test_cli.py::test_a_compile_pass_into_a_log_prints_a_line_per_build": 27,
    "tests/test_adversary_cpu.py::test_cutlass_smid_builds": 16,
    "tests/test_compile_speed.py::test_relocatable_builds_that_differ_only_in_text_keep_their_device_code": 12,
    # (each builds its own kernel under pytest -n: test_kernels.py's builds fixture)
    "tests/test_kernels.py::test_representative_kernels_compile_with_nvcc[moe_grouped_gemm.pingpong_64x128x64]": 30,
    "tests/test_kernels.py::test_representative_kernels_compile_with_nvcc": 3,
    # the README's run (-m "not slow")
    "tests/test_light_headers.py::test_every_light_header_kernel_builds_the_same_sass_as_with_the_whole_headers": 60,
    "tests/test_cluster_ray.py::test_cli_search_on_a_local_cluster": 9,
    "tests/test_cluster_ray.py::test_search_spreads_over_hosts_and_survives_a_lost_one": 9,
    "tests/test_agents.py::test_kill_9_then_resume_loses_nothing": 9,
    "tests/test_agents.py::test_same_seed_same_search": 7,
    "tests/test_cli_errors.py::test_an_llm_nobody_answers_stops_the_search_at_once_with_the_reason": 7,
    "tests/test_design.py::test_mutation_stays_valid_over_10000_draws": 6,
}


def seconds(nodeid: str) -> float:
    """What :data:`SECONDS` says a test costs (0 where it says nothing)."""
    return SECONDS.get(nodeid, SECONDS.get(nodeid.split("[", 1)[0], 0))
