printf 'set up 1207\n' > setup.log
