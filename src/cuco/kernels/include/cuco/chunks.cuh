// A side-stream kernel's chunk plan (cuco.design.tiles.ChunkPlan) as a launch argument: how
// one shape's rows are cut into chunks. Passed by value to every kernel that reads it, so one
// build serves every shape of its workload, dtype and world size (the evaluator's small-shape
// check runs the very binary it times). Whether the plan is ragged stays compile-time: it
// picks the kernel bodies. Packed on the host by cuco.design.tiles.pack_chunk_geom, whose
// layout a CPU test checks against this one; add a field in both places.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuco {

struct ChunkGeom {
  uint64_t chunk_elems;  // elements of a full chunk (rows x row_elems)
  uint64_t row_elems;    // elements of a row
  uint64_t chunk_rows;   // rows of a full chunk
  uint64_t last_rows;    // rows of the last chunk of each block (chunk_rows unless ragged)
  uint64_t block_rows;   // rows of a block (all M, one owner's or one source rank's rows)
  int32_t chunks;        // chunks in all: blocks x block_chunks
  int32_t block_chunks;  // chunks per block

  // Rows of chunk `local` of a block (a ragged plan's last one is short).
  __host__ __device__ __forceinline__ size_t rows_of(int local) const {
    return local == block_chunks - 1 ? last_rows : chunk_rows;
  }
  // First row of chunk `local` of block `block`.
  __host__ __device__ __forceinline__ size_t row0(int block, int local) const {
    return (size_t)block * block_rows + (size_t)local * chunk_rows;
  }
};

}  // namespace cuco
