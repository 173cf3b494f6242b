// The fusion report: for every edge of a tile graph -- a producer op, a consumer op and the tensor
// between them -- the class of the data mapping, derived from the tiles' read and write sets, after
// DNNFusion's mapping types (Niu et al., PLDI 2021: one-to-one, reorganize, shuffle, one-to-many,
// many-to-many), and what it means for running the two ops as one dataflow: which producer tiles
// each consumer tile waits on, and how early the first consumer tile can start.
//
// Classes, from the tiles (every element of the tensor counted by the tiles that read it):
//   one-to-one    each element is read once, and each consumer tile reads exactly the region one
//                 producer tile wrote (fan-in 1, fan-out 1)
//   reorganize    each element is read once; a consumer tile reads a block of producer tiles that
//                 forms a rectangle of the producer's grid (re-tiled, same layout)
//   shuffle       each element is read once; some consumer tile reads producer tiles that do not
//                 form one rectangle (the data is permuted, e.g. the gate and up halves of SiLU*mul)
//   one-to-many   elements are read by several consumer tiles, each of which waits on one producer tile
//   many-to-many  elements are read by several consumer tiles, each of which waits on several
//                 producer tiles (a GEMM reading a K panel; a norm reading whole rows)
#pragma once

#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

enum class EdgeClass { OneToOne, Reorganize, Shuffle, OneToMany, ManyToMany };
const char* to_string(EdgeClass c);

struct FusionEdge {
  int producer = -1, consumer = -1, tensor = -1;  // op, op, tensor ids
  EdgeClass cls = EdgeClass::OneToOne;
  int producer_tiles = 0, consumer_tiles = 0;     // tiles of each op
  int pairs = 0;                                  // (producer tile, consumer tile) dependencies through the tensor
  int fan_in_min = 0, fan_in_max = 0;             // producer tiles a consumer tile waits on (consumers that read it)
  double fan_in_mean = 0;
  int fan_out_min = 0, fan_out_max = 0;           // consumer tiles a producer tile feeds (producers that feed any)
  double fan_out_mean = 0;
  double reads_per_element = 0;                   // consumer reads / elements the producer wrote
  bool barrier = false;                           // some consumer tile waits on every producer tile
  std::string meaning;                            // what it means for fusing the two ops, one sentence
};

// Every (producer op, consumer op, tensor) with at least one tile dependency, producers first.
std::vector<FusionEdge> fusion_report(const TileGraph& g);

}  // namespace tw
