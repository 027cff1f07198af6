"""Each replica gets its own devices (pure logic; the real split is checked in
tests/server/test_vllm_replicas.py::test_two_real_replicas_behind_the_router)."""

from __future__ import annotations

from agentkv.vllm._devices import cpu_groups, replica_device_env, visible_gpus
from agentkv.vllm._replicas import _tensor_parallel_size


def test_cpus_split_into_contiguous_groups() -> None:
    assert cpu_groups([0, 1], 2) == [[0], [1]]
    assert cpu_groups([3, 0, 1, 2, 4], 2) == [[0, 1, 2], [3, 4]]
    assert cpu_groups([0], 2) is None
    envs, why = replica_device_env("cpu", 2, cpus=[0, 1, 2, 3], environ={})
    assert why is None
    assert envs == [{"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, {"VLLM_CPU_OMP_THREADS_BIND": "2-3"}]
    envs, _ = replica_device_env("cpu", 2, cpus=[0, 2, 4, 5], environ={})
    assert envs[0] == {"VLLM_CPU_OMP_THREADS_BIND": "0,2"}
    assert envs[1] == {"VLLM_CPU_OMP_THREADS_BIND": "4-5"}


def test_nothing_is_split_when_devices_are_short_or_the_caller_chose() -> None:
    envs, why = replica_device_env("cpu", 3, cpus=[0, 1], environ={})
    assert envs == [{}, {}, {}] and why is not None and "share" in why
    envs, why = replica_device_env("cpu", 2, cpus=[0, 1], environ={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    assert envs == [{}, {}] and why is not None
    envs, why = replica_device_env(
        "cpu", 2, cpus=[0, 1], environ={}, extra_env={"VLLM_CPU_OMP_THREADS_BIND": "1"}
    )
    assert envs == [{}, {}] and why is not None
    assert replica_device_env("cpu", 1, cpus=[0, 1], environ={}) == ([{}], None)


def test_gpus_split_by_tensor_parallel_size() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert visible_gpus(env) == ["4", "5", "6", "7"]
    envs, why = replica_device_env("cuda", 2, environ=env)
    assert why is None
    assert envs == [{"CUDA_VISIBLE_DEVICES": "4"}, {"CUDA_VISIBLE_DEVICES": "5"}]
    envs, _ = replica_device_env("cuda", 2, environ=env, tensor_parallel_size=2)
    assert envs == [{"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    envs, why = replica_device_env("cuda", 2, environ=env, tensor_parallel_size=4)
    assert envs == [{}, {}] and why is not None and "4 GPUs" in why
    envs, why = replica_device_env(
        "cuda", 2, environ=env, extra_env={"CUDA_VISIBLE_DEVICES": "0"}
    )
    assert envs == [{}, {}] and why is not None


def test_tensor_parallel_size_from_pass_through_args() -> None:
    assert _tensor_parallel_size([]) == 1
    assert _tensor_parallel_size(["--tensor-parallel-size", "2"]) == 2
    assert _tensor_parallel_size(["--max-num-seqs", "8", "-tp=4"]) == 4
    assert _tensor_parallel_size(["--tensor-parallel-size", "x"]) == 1
