// A schedule: the order in which tiles run. Ticket i of the GPU executor runs tile order[i], and the
// traffic model simulates the same sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

struct Schedule {
  std::string name;
  std::vector<int> order;  // tile ids
  // Tickets of several tiles (stream-K units): ticket u runs the tiles at positions
  // [units[u], units[u + 1]) one after another on one CTA, and consecutive K slices of one output
  // block there are summed in registers (one partial sum, one epilogue: fused_with_next). Empty:
  // every tile is a ticket of its own. Otherwise units[0] = 0, ascending, units.back() = order.size().
  std::vector<int> units;
  int num_tickets() const { return units.empty() ? static_cast<int>(order.size()) : static_cast<int>(units.size()) - 1; }
  // Positions [first, end) of ticket u.
  int ticket_begin(int u) const { return units.empty() ? u : units[u]; }
  int ticket_end(int u) const { return units.empty() ? u + 1 : units[u + 1]; }
};

// Throws InvalidArgument naming the first offending position/tile unless `s` is a permutation of
// the graph's tiles in which every tile comes after all of its dependencies (and its units, if any,
// cut the positions into non-empty runs).
void validate(const TileGraph& g, const Schedule& s);

// By position: 1 where the tile and the next one belong to the same ticket and are consecutive K
// slices of one output block (same op, tm, tn; ks + 1). The CTA that runs them keeps accumulating:
// the first adds no partial sum and runs no epilogue; the segment's last tile does both for all of
// them (the executor's sm90 body, src/ops/ffn_sm90.cu; the traffic and time replays alike).
std::vector<uint8_t> fused_with_next(const TileGraph& g, const Schedule& s);

// True when in every split-K output block (an op's tiles of one tm, tn with split_k > 1) the slice
// of the last K range present in `s` comes after the block's other slices: that slice may then wait
// for the others to sum the block without waiting for a later ticket, so the executor's
// no-deadlock argument holds (the sm90 body's split finisher, FfnOptions::split_finisher; the time
// replay models it on the same condition).
bool split_finisher_last(const TileGraph& g, const Schedule& s);

// Deals a schedule's positions to slots as the executor deals its tickets (the traffic and time
// replays share it): a slot runs its ticket's positions in turn, then draws the next ticket.
class TicketDealer {
 public:
  struct Cursor {
    int pos = -1;        // the slot's position in the order (-1: none)
    int end = -1;        // the end of its ticket's positions
    int run_begin = -1;  // the first position of its run of fused K slices (fused_with_next)
    int run_slices() const { return pos - run_begin + 1; }  // the run's K slices up to pos
  };
  TicketDealer(const TileGraph& g, const Schedule& s);
  // c to its slot's next position: the rest of its ticket, else the next ticket's first; false (and
  // c.pos = -1) once every ticket is dealt.
  bool next(Cursor& c);
  // The tile at `pos` sums on into the next one: it adds no partial sum and writes nothing yet.
  bool runs_on(int pos) const { return fused_[pos] != 0; }
  // The tile at `pos` is in a run of every K slice of its block, from slice 0: the executor's sm90
  // body runs such a run as one ticket (run_whole_units), with no restart between its slices.
  bool in_whole_run(int pos) const { return whole_[pos] != 0; }
  int tile(const Cursor& c) const { return s_.order[c.pos]; }

 private:
  const Schedule& s_;
  std::vector<uint8_t> fused_, whole_;
  int next_ticket_ = 0;
};

// `s` restricted to the positions where keep[tile] is set, in the same order; a unit of `s` keeps
// the tiles it has left (units left empty vanish).
Schedule restrict_schedule(const Schedule& s, const std::vector<uint8_t>& keep);

// Ops one after another, each op's tiles in id order (row-major over (tm, tn, ks)).
Schedule op_by_op_order(const TileGraph& g);

// Dataflow: every tile moved to just after the last of its dependencies, otherwise keeping the
// order of `base` (stable). In an FFN the down-projection tiles of a K slice then follow the
// gate/up tiles that produce that slice, instead of waiting for the whole first GEMM.
// With lag L > 0 a consumer comes at least L positions after its last producer: on a GPU running
// L tiles at once, a consumer placed closer would only wait for producers still in flight.
Schedule dataflow_order(const TileGraph& g, const Schedule& base, int lag = 0);

}  // namespace tw
