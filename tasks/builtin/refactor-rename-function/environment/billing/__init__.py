from billing.totals import calc_total
